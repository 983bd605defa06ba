"""A torchrun job stopped part-way and resumed from its checkpoint: that a run continues from
what the device wrote (a GPU's checkpoint on a GPU machine), and what each job costs.

    python benchmarks/bench_resume.py [--processes 1] [--epochs 2] [--stop-after 30]
                                      [--checkpoint-every 10] [--batch-size 32]
                                      [--genes 1000 --cells-per-condition 45 ...]
                                      [--data-path ./data/bench_resume] [--logs DIR] [--json F] [--record]

The synthetic dataset (``harness.synthetic.synthetic_folder``; by default the generator's
7,300 cells x 1,000 genes) is written once under ``--data-path``. Two jobs of
``torchrun --standalone --nproc_per_node=N -m gears_ddp.launch --config run.yaml`` then
train it into one run folder, on the GPUs torch sees (one a process) or else on the CPU with
gloo, with the published hyperparameters (hidden size 64), ``--epochs`` epochs and a
checkpoint every ``--checkpoint-every`` optimiser steps:

1. stopped: ``--set args.max_steps=S`` (``--stop-after``): the job stops after S optimiser
   steps, ends that epoch with its evaluation and writes its report;
2. resumed: ``--set args.resume_from=auto``: the job continues from the newest checkpoint,
   the one the first job wrote at step S, to the end of the last epoch.

Per job: its exit status; its wall seconds, from the start of torchrun to its end (process
starts, data preparation, training, evaluation and the run folder); the optimiser steps and
epochs it trained; the test ``pearson_delta`` of its report (``report.json``). For the
resumed job also the checkpoint it resumed from and where, read from its log line
("resuming from <checkpoint>: epoch E, after optimiser step K of the epoch"). The script
fails (exit 1) when a job fails, when the first left no checkpoint of step S, or when the
second did not resume from it or did not reach the last epoch. ``--logs DIR`` keeps both
jobs' output (``stopped.log``, ``resumed.log``) and the run's ``train.log`` there.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.record import add_json_argument, add_record_argument, recorded, write_figures
from harness.settings import HIDDEN_SIZE
from harness.synthetic import add_size_arguments, synthetic_folder, write_run_config
from harness.tables import format_number, print_table
from harness.timing import Stopwatch
from harness.torchrun import job_environment, torchrun_command

RESUMED = re.compile(r"resuming from (\S+): epoch (\d+), after optimiser step (\d+) of the epoch")


def run_job(config: Path, processes: int, setting: str, log: Path) -> dict:
    """One torchrun job of ``config`` with ``--set setting``; its output to ``log``."""
    command = torchrun_command(processes, "-m", "gears_ddp.launch", "--config", str(config), "--set", setting)
    with open(log, "w", encoding="utf-8") as output, Stopwatch() as watch:
        done = subprocess.run(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            env=job_environment({"OMP_WAIT_POLICY": "PASSIVE"}),
        )
    return {"exit": done.returncode, "seconds": watch.seconds}


def report_figures(save_path: Path) -> dict:
    """The epochs, optimiser steps and test ``pearson_delta`` of the run's ``report.json``."""
    path = save_path / "report.json"
    if not path.exists():
        return {"epochs": None, "test_pearson_delta": None}
    report = json.loads(path.read_text(encoding="utf-8"))
    return {"epochs": len(report["history"]), "test_pearson_delta": report["model"]["test_pearson_delta"]}


def checkpoint_steps(save_path: Path) -> list[int]:
    """The optimiser steps of the checkpoints in the run folder."""
    return sorted(
        int(m.group(1))
        for path in (save_path / "checkpoints").glob("checkpoint-*.pt")
        if (m := re.fullmatch(r"checkpoint-(\d+)\.pt", path.name))
    )


def resumed_from(log: Path) -> dict | None:
    """The checkpoint, epoch and step the job's log says it resumed from (None: no such line)."""
    found = RESUMED.search(log.read_text(encoding="utf-8", errors="replace"))
    if found is None:
        return None
    return {"checkpoint": Path(found.group(1)).name, "epoch": int(found.group(2)), "step_in_epoch": int(found.group(3))}


def stop_and_resume(args, folder: Path, save_path: Path, logs: Path) -> dict:
    """The two jobs (see the module docstring) on the dataset in ``folder``, into the run
    folder ``save_path``; their figures and the checks' outcome."""
    import torch

    options = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "model_config": {"hidden_size": HIDDEN_SIZE},
        "checkpoint_every_steps": args.checkpoint_every,
        "save_path": str(save_path),
    }
    config = write_run_config(logs / "run.yaml", folder.parent, folder.name, options)
    stopped = run_job(config, args.processes, f"args.max_steps={args.stop_after}", logs / "stopped.log")
    stopped.update(report_figures(save_path), steps=args.stop_after, checkpoints=checkpoint_steps(save_path))
    resumed = run_job(config, args.processes, "args.resume_from=auto", logs / "resumed.log")
    resumed.update(report_figures(save_path), resumed_from=resumed_from(logs / "resumed.log"))
    if (save_path / "train.log").exists():
        shutil.copy(save_path / "train.log", logs / "train.log")
    expected = f"checkpoint-{args.stop_after:09d}.pt"
    failures = [
        f"the {name} job exited with {job['exit']}"
        for name, job in (("stopped", stopped), ("resumed", resumed))
        if job["exit"]
    ]
    if args.stop_after not in stopped["checkpoints"]:
        failures.append(f"the stopped job left no checkpoint of step {args.stop_after} ({stopped['checkpoints']})")
    if (resumed["resumed_from"] or {}).get("checkpoint") != expected:
        failures.append(f"the resumed job did not say it resumed from {expected} ({resumed['resumed_from']})")
    if resumed["epochs"] != args.epochs:
        failures.append(f"the resumed job's report has {resumed['epochs']} epoch(s), not {args.epochs}")
    return {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "processes": args.processes,
        "stopped": stopped,
        "resumed": resumed,
        "failures": failures,
    }


def print_figures(figures: dict, shape: tuple[int, int]) -> None:
    stopped, resumed = figures["stopped"], figures["resumed"]
    where = resumed["resumed_from"]
    print(
        f"\ntorchrun --standalone --nproc_per_node={figures['processes']} -m gears_ddp.launch, "
        f"{figures['device']} rank(s); synthetic data {shape[0]:,} cells x {shape[1]:,} genes\n"
    )
    print_table(
        ["job", "exit", "seconds", "trained", "epochs in its report", "test pearson_delta"],
        [
            [
                "stopped (args.max_steps)",
                stopped["exit"],
                f"{stopped['seconds']:.1f}",
                f"{stopped['steps']} steps",
                stopped["epochs"],
                format_number(stopped["test_pearson_delta"]),
            ],
            [
                "resumed (args.resume_from=auto)",
                resumed["exit"],
                f"{resumed['seconds']:.1f}",
                "to the end",
                resumed["epochs"],
                format_number(resumed["test_pearson_delta"]),
            ],
        ],
    )
    print(
        f"\ncheckpoints after the stopped job: steps {stopped['checkpoints']}; the resumed job: "
        + (
            f"resumed from {where['checkpoint']}, epoch {where['epoch']}, after step {where['step_in_epoch']} "
            "of the epoch"
            if where
            else "no 'resuming from' line in its log"
        )
    )
    print("checks: " + ("; ".join(figures["failures"]) if figures["failures"] else "all passed"))


def dataset_shape(folder: Path) -> tuple[int, int]:
    """(cells, genes) of the processed dataset in ``folder``."""
    import anndata

    adata = anndata.read_h5ad(folder / "perturb_processed.h5ad", backed="r")
    return adata.n_obs, adata.n_vars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=1, help="torchrun processes (one a GPU when there are)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stop-after", type=int, default=30, help="optimiser steps of the stopped job")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="optimiser steps between checkpoints")
    parser.add_argument("--batch-size", type=int, default=32, help="cells per batch and process")
    add_size_arguments(parser)
    parser.add_argument("--data-path", default="./data/bench_resume")
    parser.add_argument("--logs", help="keep both jobs' output and the run's train.log in this folder")
    add_json_argument(parser)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.stop_after % args.checkpoint_every:
        parser.error("--stop-after must be a multiple of --checkpoint-every: the resumed job starts at a checkpoint")

    folder = synthetic_folder(args.data_path, args)
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(args.logs) if args.logs else Path(tmp) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        figures = stop_and_resume(args, folder, Path(tmp) / "run", logs)
    with recorded(args.record):
        print_figures(figures, dataset_shape(folder))
    if args.json:
        write_figures(args.json, figures)
    if figures["failures"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
