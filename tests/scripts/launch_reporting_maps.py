"""``python -m gears_ddp.launch`` for a torchrun test: when training is done, and while every
rank is still alive, each rank writes ``$MAPS_REPORT/rank<r>.json`` describing its mapping
of the dataset's expression file (from ``/proc/self/smaps``)."""
import json
import os
from pathlib import Path

import torch.distributed as dist

import gears_ddp.training.recipe as recipe
from gears_ddp.distributed import launch


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
    return {"path": path, "permissions": fields.get("permissions"), "resident_kib": fields.get("Rss", 0),
            "shared_kib": fields.get("Shared_Clean", 0) + fields.get("Shared_Dirty", 0),
            "private_kib": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)}


finish = recipe.TrainingRecipe._finish


def finish_and_report(self):
    report = finish(self)
    folder = Path(os.environ["MAPS_REPORT"])
    folder.mkdir(exist_ok=True)
    mapped = self.gears.pert_data.cells.mapped_from
    (folder / f"rank{self.ranks.rank}.json").write_text(json.dumps(mapping_of(mapped)))
    dist.barrier()  # both ranks read their mappings before either leaves
    return report


recipe.TrainingRecipe._finish = finish_and_report

if __name__ == "__main__":
    launch.main()
