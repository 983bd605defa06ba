"""``--record``: append what a benchmark prints to ``benchmarks/RESULTS.md``, so that no
figure is copied by hand.

A recorded section starts with the date, the command and the machine (CPU, cores, GPU,
torch and CUDA versions); its body is exactly what the script printed to stdout.
"""
from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def add_record_argument(parser) -> None:
    parser.add_argument("--record", action="store_true",
                        help=f"also append the printed tables to {RESULTS.relative_to(RESULTS.parents[1])}")


def machine() -> str:
    """The machine in words: CPU model and cores, GPU, torch and CUDA versions."""
    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = (f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}, CUDA {torch.version.cuda}"
           if torch.cuda.is_available() else "no GPU")
    return f"{cpu}, {cores} cores; {gpu}; torch {torch.__version__}"


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
    section = (f"\n## {datetime.date.today().isoformat()}: `{command}`\n\nMachine: {machine()}.\n\n"
               f"{captured.getvalue().strip()}\n")
    with open(RESULTS, "a", encoding="utf-8") as handle:
        handle.write(section)
    print(f"\nrecorded in {RESULTS}", file=sys.stderr)
