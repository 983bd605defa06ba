"""CPU threads under competing load: seconds of one training epoch for several thread and
OpenMP settings, on an idle machine and beside processes that keep cores busy.

    python benchmarks/bench_threads.py [--competitors 0 1] [--epochs 2] [--genes 1000 ...] [--record]
    python benchmarks/bench_threads.py --ranks 2 [--competitors 0] ...

Each setting runs in its own process (OpenMP reads its environment once, at start), which
trains ``GEARS`` in one process, as a user does, on the synthetic data (simulation split,
batch 32, hidden 64), and reports the mean ``train_seconds`` of the epochs after the
first. A competitor is a process spinning on one core (``while True: pass``), started
before the run and stopped after it: what another user's job does to a shared node.

Settings: torch's default thread count (every core this process may use); one thread per
core minus one; ``gears_ddp``'s choice (``gears_ddp.runtime.threads.cpu_threads``); the first
with ``OMP_WAIT_POLICY=PASSIVE`` (OpenMP threads sleep instead of spinning while they wait)
and with OpenMP's bounded spin (``GOMP_SPINCOUNT``: spin that many times, then sleep).

With ``--ranks R`` (R > 1), each setting's process runs ``train_multi_gpu`` with
``cpu_processes=R`` instead: R spawned ranks sharing the cores, ``cores / R`` threads each,
rank 0's epochs reported. The settings are then the OpenMP waiting the ranks get:
``gears_ddp``'s (passive, where ranks share the machine), OpenMP's default and a bounded spin,
each given in the environment (which the workers keep). On a machine of more than 2 cores
this measures the one case docs/distributed.md leaves open: several ranks of several threads
each, the cores not oversubscribed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.child import run_in_child
from harness.models import trained_model
from harness.record import add_record_argument, recorded
from harness.settings import BATCH_SIZE, HIDDEN_SIZE, SPLIT
from harness.synthetic import add_size_arguments, load_dataset, synthetic_options
from harness.tables import print_table

SETTINGS = {  # name -> (threads: 'default', 'cores-1', 'library'; extra environment)
    "torch default (all cores)": ("default", {}),
    "cores - 1": ("cores-1", {}),
    "gears_ddp.runtime.threads.cpu_threads": ("library", {}),
    "all cores, OMP_WAIT_POLICY=PASSIVE": ("default", {"OMP_WAIT_POLICY": "PASSIVE"}),
    "all cores, GOMP_SPINCOUNT=10000": ("default", {"GOMP_SPINCOUNT": "10000"}),
    "all cores, GOMP_SPINCOUNT=100000": ("default", {"GOMP_SPINCOUNT": "100000"}),
}
RANKS_SETTINGS = {  # name -> the environment the spawning process is given (its workers keep it)
    "gears_ddp's choice (passive)": {},
    "OpenMP's default (GOMP_SPINCOUNT=300000)": {"GOMP_SPINCOUNT": "300000"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
}


def measured_run(data_path: str, threads: str, epochs: int) -> dict:
    """In a child process of its own (``run_in_child``): train with the given thread choice;
    the threads used and the mean training-loop seconds of the epochs after the first."""
    import torch

    from gears_ddp.runtime.threads import cpu_threads, usable_cores

    if threads == "cores-1":
        torch.set_num_threads(max(1, usable_cores() - 1))
    elif threads == "library":
        torch.set_num_threads(cpu_threads())
    gears, _ = trained_model(load_dataset(data_path, Path(data_path) / "synthetic"), epochs)
    seconds = [record["train_seconds"] for record in gears.history]
    steady = seconds[1:] if len(seconds) > 1 else seconds
    return {"threads": torch.get_num_threads(), "train_s": statistics.fmean(steady)}


def measured_ranks_run(data_path: str, ranks: int, epochs: int) -> dict:
    """In a child process of its own: ``train_multi_gpu`` with ``ranks`` CPU processes; the
    threads of each rank and the mean training-loop seconds of rank 0's epochs after the
    first."""
    from gears_ddp import train_multi_gpu
    from gears_ddp.runtime.threads import cpu_threads

    report = train_multi_gpu(
        data_path,
        "synthetic",
        SPLIT,
        {
            "epochs": epochs,
            "batch_size": BATCH_SIZE,
            "model_config": {"hidden_size": HIDDEN_SIZE},
            "cpu_processes": ranks,
            "save_path": str(Path(data_path) / f"run-{ranks}-ranks"),
            "overwrite_save_path": True,  # each setting trains afresh in the same folder
        },
    )
    seconds = [record["train_seconds"] for record in report["history"]]
    steady = seconds[1:] if len(seconds) > 1 else seconds
    return {"threads": cpu_threads(ranks), "train_s": statistics.fmean(steady)}


def measure(data_path: Path, threads: str, environment: dict, epochs: int, competitors: int, ranks: int = 1) -> dict:
    """``measured_run`` (``measured_ranks_run`` for ``ranks`` > 1) in a child process with
    ``environment``, beside ``competitors`` processes that each keep a core busy."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(competitors)]
    try:
        run = (
            ("measured_run", str(data_path), threads, epochs)
            if ranks == 1
            else ("measured_ranks_run", str(data_path), ranks, epochs)
        )
        result = run_in_child(
            __file__,
            *run,
            environment=environment,
            label=f"the run of {ranks} rank(s) with threads {threads} and {environment or 'no extra environment'}",
        )
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    if result is None:
        raise SystemExit(1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--competitors", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--ranks", type=int, default=1, help="train_multi_gpu with this many CPU processes (default 1: GEARS.train)"
    )
    add_size_arguments(parser)
    parser.add_argument(
        "--settings",
        nargs="+",
        choices=[*SETTINGS, *RANKS_SETTINGS],
        help="which settings to run (default: all of the mode's: one process, or --ranks)",
    )
    add_record_argument(parser)
    args = parser.parse_args()
    from gears_ddp.datasets import write_synthetic_dataset
    from gears_ddp.runtime.threads import usable_cores

    settings = SETTINGS if args.ranks == 1 else {name: ("library", env) for name, env in RANKS_SETTINGS.items()}
    chosen = [name for name in settings if args.settings is None or name in args.settings]
    if not chosen:
        parser.error(f"none of --settings is a setting of this mode: {', '.join(settings)}")
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_dataset(tmp, **synthetic_options(args))
        results = {
            name: {
                n: measure(Path(tmp), settings[name][0], settings[name][1], args.epochs, n, args.ranks)
                for n in args.competitors
            }
            for name in chosen
        }
    with recorded(args.record):
        processes = "one process" if args.ranks == 1 else f"train_multi_gpu with {args.ranks} CPU processes"
        print(
            f"\nseconds per training epoch (after the first), {processes}, batch 32, hidden {HIDDEN_SIZE}; "
            f"{usable_cores()} usable cores; competitors spin one core each\n"
        )
        print_table(
            ["setting", *(f"{n} competitor(s)" for n in args.competitors)],
            [
                [name, *(f"{by_load[n]['train_s']:.2f} s ({by_load[n]['threads']}t)" for n in args.competitors)]
                for name, by_load in results.items()
            ],
        )


if __name__ == "__main__":
    main()
