"""``gears-ddp train`` for a torchrun test: when training is done, and while every
rank is still alive, each rank writes ``$MAPS_REPORT/rank<r>.json`` describing its mapping
of the dataset's expression file (from ``/proc/self/smaps``)."""

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from gears_ddp.cli import main
from gears_ddp.gears import GEARS


def mapping_of(path: str) -> dict:
    """Permissions, resident, shared and private KiB of this process's mapping of ``path``."""
    found, fields = None, {}
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5:  # a mapping's header line
            found = parts[1] if len(parts) > 5 and parts[5] == path else None
        elif found and parts[0].endswith(":") and len(parts) == 3:
            fields[parts[0][:-1]] = fields.get(parts[0][:-1], 0) + int(parts[1])
            fields["permissions"] = found
    return {
        "path": path,
        "permissions": fields.get("permissions"),
        "resident_kib": fields.get("Rss", 0),
        "shared_kib": fields.get("Shared_Clean", 0) + fields.get("Shared_Dirty", 0),
        "private_kib": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
    }


train_with = GEARS.train_with


def train_and_report(self, options, ranks, *more):
    report = train_with(self, options, ranks, *more)
    folder = Path(os.environ["MAPS_REPORT"])
    folder.mkdir(exist_ok=True)
    mapped = self.pert_data.cells.mapped_from
    (folder / f"rank{ranks.rank}.json").write_text(json.dumps(mapping_of(mapped)))
    dist.barrier()  # both ranks read their mappings before either leaves
    return report


GEARS.train_with = train_and_report

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
