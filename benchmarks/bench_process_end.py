"""How long a process of the library takes to end once its work is done, with its heap frozen
as it ends (``gears_ddp.runtime.process_end``, what the library does) beside the same process
ending as it did before (CPython's final collections walk the whole heap):

- a spawned rank: ``spawn_workers`` starts one worker that trains one epoch of the synthetic
  data with a run folder (``GEARS.train(save_path=...)``: the run report and its pictures, so
  matplotlib too, as rank 0 of every run) and sends the moment its work ended; the figure is
  from then to the moment the parent sees the process end (polled every 10 ms). Before: the
  worker takes the freeze out of its own process as it returns.
- the ``gears-ddp`` command: ``gears-ddp train --config`` of one CPU process (its run trains in
  the command's own process), run by ``main()`` in a child, which then says the time and ends
  as ``command()`` does (the heap frozen) or as before (``main()`` alone); the figure is from
  that moment to the child's end as its parent sees it.

    python benchmarks/bench_process_end.py [--repeats 3] [--genes 200 ...] [--record]

Each figure is the median over ``--repeats`` processes, the two ways side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.machine import describe_machine
from harness.record import add_record_argument, recorded
from harness.settings import SPLIT
from harness.synthetic import add_size_arguments, load_dataset, synthetic_options, write_run_config
from harness.tables import print_table

HIDDEN_SIZE = 16
COMMAND_CHILD = """
import sys, time
from gears_ddp.cli import main
from gears_ddp.runtime.process_end import heap_frozen_for_exit
status = main(sys.argv[2:])
print(time.time(), file=sys.stderr, flush=True)
if sys.argv[1] == "frozen":
    heap_frozen_for_exit()
sys.exit(status)
"""


def _train_then_say_when(local_rank, data_path: str, folder: str, save_path: str, frozen: bool, messages) -> None:
    """A spawned worker: one epoch with a run folder, then the time its work ended."""
    import torch

    import gears_ddp.launching.supervisor as supervisor
    from gears_ddp import GEARS

    pert_data = load_dataset(data_path, folder)
    pert_data.get_dataloader(32, test_batch_size=64)
    torch.manual_seed(0)
    gears = GEARS(pert_data)
    gears.model_initialize(hidden_size=HIDDEN_SIZE)
    gears.train(epochs=1, save_path=save_path)
    if not frozen:  # as before: this process ends without the freeze
        supervisor.heap_frozen_for_exit = lambda: None
    messages.put(time.time())


def rank_end_seconds(data_path: Path, folder: Path, work: Path, frozen: bool, repeat: int) -> float:
    """Seconds from a spawned rank's last message to its end, as its parent sees it."""
    from gears_ddp.launching.supervisor import spawn_workers

    save_path = work / f"rank-{'frozen' if frozen else 'before'}-{repeat}"
    (said,) = spawn_workers(_train_then_say_when, (str(data_path), str(folder), str(save_path), frozen), 1, poll_s=0.01)
    return time.time() - said


def command_end_seconds(config: Path, frozen: bool) -> float:
    """Seconds from the end of ``gears-ddp train``'s work to its process's end."""
    arguments = ["train", "--config", str(config), "--set", "args.overwrite_save_path=true"]
    child = subprocess.Popen(
        [sys.executable, "-c", COMMAND_CHILD, "frozen" if frozen else "before", *arguments],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = None
    for line in child.stderr:  # the last line of its log is the time its work ended
        said = line
    child.wait()
    ended = time.time()
    if child.returncode != 0 or said is None:
        raise SystemExit(f"gears-ddp train failed (exit {child.returncode})")
    return ended - float(said)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="processes of each kind and way (median)")
    add_size_arguments(parser, genes=200, cells_per_condition=20, perturbed_genes=10, combos=10, control_cells=300)
    add_record_argument(parser)
    args = parser.parse_args()
    from gears_ddp.datasets import write_synthetic_dataset

    seconds: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = write_synthetic_dataset(work / "data", **synthetic_options(args))
        load_dataset(work / "data", folder)  # the split file and graphs, once, before any timing
        config = write_run_config(
            work / "run.yaml",
            work / "data",
            folder.name,
            {
                "epochs": 1,
                "cpu_processes": 1,
                "save_path": str(work / "command-run"),
                "model_config": {"hidden_size": HIDDEN_SIZE},
            },
            SPLIT,
        )
        for repeat in range(args.repeats):
            for frozen in (True, False):  # alternated, so that a slow moment of the machine hits both
                seconds.setdefault(("a spawned rank", frozen), []).append(
                    rank_end_seconds(work / "data", folder, work, frozen, repeat)
                )
                seconds.setdefault(("the gears-ddp command", frozen), []).append(command_end_seconds(config, frozen))
    with recorded(args.record):
        print(
            f"\nseconds from the end of a process's work to its end (median of {args.repeats}), after one epoch "
            f"with a run folder; {describe_machine()}\n"
        )
        rows = []
        for kind in ("a spawned rank", "the gears-ddp command"):
            frozen, before = (statistics.median(seconds[(kind, way)]) for way in (True, False))
            rows.append([kind, f"{before:.2f}", f"{frozen:.2f}", f"{before / frozen:.1f}x"])
        print_table(["process", "as before (s)", "heap frozen as it ends (s)", "before / frozen"], rows)


if __name__ == "__main__":
    main()
