"""CPU threads under competing load: seconds of one training epoch for several thread and
OpenMP settings, on an idle machine and beside processes that keep cores busy.

    python benchmarks/bench_threads.py [--competitors 0 1] [--epochs 2] [--genes 1000 ...] [--record]

Each setting runs in its own process (OpenMP reads its environment once, at start), which
trains ``GEARS`` in one process, as a user does, on the synthetic data (simulation split,
batch 32, hidden 64), and reports the mean ``train_seconds`` of the epochs after the
first. A competitor is a process spinning on one core (``while True: pass``), started
before the run and stopped after it: what another user's job does to a shared node.

Settings: torch's default thread count (every core this process may use); one thread per
core minus one; ``gears_ddp``'s choice (``gears_ddp.runtime.threads.cpu_threads``); and the first
with ``OMP_WAIT_POLICY=PASSIVE`` (OpenMP threads sleep instead of spinning while they wait).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data import add_size_arguments, synthetic_options  # noqa: E402
from bench_model import HIDDEN_SIZE, LR, WEIGHT_DECAY  # noqa: E402
from results import add_record_argument, recorded  # noqa: E402

SETTINGS = {  # name -> (threads: 'default', 'cores-1', 'library'; extra environment)
    "torch default (all cores)": ("default", {}),
    "cores - 1": ("cores-1", {}),
    "gears_ddp.runtime.threads.cpu_threads": ("library", {}),
    "all cores, OMP_WAIT_POLICY=PASSIVE": ("default", {"OMP_WAIT_POLICY": "PASSIVE"}),
    "all cores, GOMP_SPINCOUNT=10000": ("default", {"GOMP_SPINCOUNT": "10000"}),
    "all cores, GOMP_SPINCOUNT=100000": ("default", {"GOMP_SPINCOUNT": "100000"}),
}


def child(data_path: str, threads: str, epochs: int) -> None:
    """Train in this process with the given thread choice; print the result as JSON."""
    import torch

    from gears_ddp import PertData
    from gears_ddp.gears import GEARS
    from gears_ddp.runtime.threads import cpu_threads, usable_cores

    if threads == "cores-1":
        torch.set_num_threads(max(1, usable_cores() - 1))
    elif threads == "library":
        torch.set_num_threads(cpu_threads())
    pert_data = PertData(data_path)
    pert_data.load(data_path=Path(data_path) / "synthetic")
    pert_data.prepare_split(split="simulation", seed=1)
    pert_data.get_dataloader(batch_size=32, test_batch_size=256)
    torch.manual_seed(0)
    gears = GEARS(pert_data)
    gears.model_initialize(hidden_size=HIDDEN_SIZE)
    gears.train(epochs=epochs, lr=LR, weight_decay=WEIGHT_DECAY)
    seconds = [record["train_seconds"] for record in gears.history]
    print("RESULT " + json.dumps({"threads": torch.get_num_threads(),
                                  "train_s": statistics.fmean(seconds[1:] if len(seconds) > 1 else seconds)}))


def measure(data_path: Path, threads: str, environment: dict, epochs: int, competitors: int) -> dict:
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(competitors)]
    try:
        done = subprocess.run([sys.executable, __file__, "--child", str(data_path), "--threads", threads,
                               "--epochs", str(epochs)], capture_output=True, text=True,
                              env={**os.environ, **environment})
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--competitors", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=2)
    add_size_arguments(parser, genes=1000, cells_per_condition=45, perturbed_genes=60, combos=80, control_cells=1000)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
                        help="which settings to run (default: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--threads", help=argparse.SUPPRESS)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.threads, args.epochs)
        return
    from gears_ddp.datasets import write_synthetic_dataset
    from gears_ddp.runtime.threads import usable_cores

    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_dataset(tmp, **synthetic_options(args))
        results = {name: {n: measure(Path(tmp), threads, environment, args.epochs, n) for n in args.competitors}
                   for name, (threads, environment) in SETTINGS.items() if name in args.settings}
    with recorded(args.record):
        print(f"\nseconds per training epoch (after the first), one process, batch 32, hidden {HIDDEN_SIZE}; "
              f"{usable_cores()} usable cores; competitors spin one core each\n")
        header = "".join(f" {f'{n} competitor(s)':>16} |" for n in args.competitors)
        print(f"| {'setting':36} |{header}")
        print(f"|{'-' * 38}|" + f"{'-' * 17}:|" * len(args.competitors))
        for name, by_load in results.items():
            cells = "".join(f" {by_load[n]['train_s']:>9.2f} s ({by_load[n]['threads']}t) |" for n in args.competitors)
            print(f"| {name:36} |{cells}")


if __name__ == "__main__":
    main()
