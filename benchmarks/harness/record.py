"""``--record``: append what a benchmark prints to ``benchmarks/RESULTS.md``, so that no
figure is copied by hand; ``--json FILE``: write its figures to a file another program
reads (``benchmarks/gpu_check.sh`` collects them).

A recorded section starts with the date, the command and the machine (CPU, cores, GPU,
torch and CUDA versions); its body is exactly what the script printed to stdout. A JSON
file holds the command, the machine and the script's figures, NaN written as null.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import shlex
import sys
from pathlib import Path

from harness.machine import describe_machine

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"


def add_record_argument(parser) -> None:
    parser.add_argument(
        "--record",
        action="store_true",
        help=f"also append the printed tables to {RESULTS.relative_to(RESULTS.parents[1])}",
    )


def add_json_argument(parser) -> None:
    parser.add_argument(
        "--json", metavar="FILE", help="also write the figures to FILE as JSON, with the command and the machine"
    )


def write_figures(path, figures: dict) -> None:
    """``--json``: ``figures`` with the command line and the machine, as strict JSON (NaN and
    infinities as null) at ``path``."""
    from gears_ddp.report.run_files import write_json

    write_json(path, {"command": sys.argv, "machine": describe_machine(), **figures})


@contextlib.contextmanager
def recorded(enabled: bool):
    """Print as usual; with ``enabled``, also append what was printed to RESULTS.md."""
    if not enabled:
        yield
        return
    captured = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, text):
            captured.write(text)
            return sys.__stdout__.write(text)

        def flush(self):
            sys.__stdout__.flush()

    with contextlib.redirect_stdout(Tee()):
        yield
    arguments = [os.path.relpath(sys.argv[0]), *(a for a in sys.argv[1:] if a != "--record")]
    command = " ".join(["python", *map(shlex.quote, arguments)])
    section = (
        f"\n## {datetime.date.today().isoformat()}: `{command}`\n\nMachine: {describe_machine()}.\n\n"
        f"{captured.getvalue().strip()}\n"
    )
    with open(RESULTS, "a", encoding="utf-8") as handle:
        handle.write(section)
    print(f"\nrecorded in {RESULTS}", file=sys.stderr)
