"""A torchrun job killed part-way and resumed from its checkpoint: that a run continues from
what the device wrote (a GPU's checkpoint on a GPU machine) after the whole job was killed
at no moment of its choosing, as a lost node or an out-of-memory killer ends it, and what
each job costs.

    python benchmarks/bench_resume.py [--processes 1] [--epochs 2] [--kill-after 30]
                                      [--checkpoint-every 10] [--batch-size 32]
                                      [--genes 1000 --cells-per-condition 45 ...]
                                      [--data-path ./data/bench_resume] [--logs DIR] [--json F] [--record]

The synthetic dataset (``harness.synthetic.synthetic_folder``; by default the generator's
7,300 cells x 1,000 genes) is written once under ``--data-path``. Two jobs of
``torchrun --standalone --nproc_per_node=N -m gears_ddp.launch --config run.yaml`` then
train it into one run folder, on the GPUs torch sees (one a process) or else on the CPU with
gloo, with the published hyperparameters (hidden size 64), ``--epochs`` epochs and a
checkpoint every ``--checkpoint-every`` optimiser steps:

1. killed: once the checkpoint of optimiser step S (``--kill-after``) is on disk, torchrun
   and its workers (each in a session of its own, so found as torchrun's descendants) are
   stopped and get SIGKILL, wherever they are: in a step, in a later checkpoint's write, in
   an evaluation. Nothing of the job may outlive it;
2. resumed: ``--set args.resume_from=auto``: the job takes the run folder over from the
   killed one and continues from the newest checkpoint the killed job left to the end of the
   last epoch.

Per job: its exit status; its wall seconds, from the start of torchrun to its end (process
starts, data preparation, training, evaluation and the run folder). For the killed job the
checkpoints it left (so where it was killed, to within ``--checkpoint-every`` steps); for
the resumed one the checkpoint, epoch and step it resumed from, read from its log line
("resuming from <checkpoint>: epoch E, after optimiser step K of the epoch"), the epochs and
test ``pearson_delta`` of its report (``report.json``). The script fails (exit 1) when the
first job ended before it was killed (give it more steps: ``--epochs``), left no checkpoint
of step S or a process alive, or when the second failed, did not resume from the newest
checkpoint or did not reach the last epoch. ``--logs DIR`` keeps both jobs' output
(``killed.log``, ``resumed.log``) and the run's ``train.log`` there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.record import add_json_argument, add_record_argument, recorded, write_figures
from harness.settings import HIDDEN_SIZE
from harness.synthetic import add_size_arguments, synthetic_folder, write_run_config
from harness.tables import format_number, print_table
from harness.timing import Stopwatch
from harness.torchrun import job_environment, torchrun_command

RESUMED = re.compile(r"resuming from (\S+): epoch (\d+), after optimiser step (\d+) of the epoch")


POLL_S = 0.005  # how often the killed job's checkpoints are looked for


def run_job(config: Path, processes: int, setting: str, log: Path) -> dict:
    """One torchrun job of ``config`` with ``--set setting``; its output to ``log``."""
    with open(log, "w", encoding="utf-8") as output, Stopwatch() as watch:
        done = subprocess.run(
            _command(config, processes, setting), stdout=output, stderr=subprocess.STDOUT, text=True, env=_environment()
        )
    return {"exit": done.returncode, "seconds": watch.seconds}


def kill_job(config: Path, processes: int, save_path: Path, step: int, log: Path) -> dict:
    """One torchrun job of ``config``, killed with SIGKILL (torchrun and every worker) as soon
    as its checkpoint of optimiser ``step`` is in ``save_path``; its output to ``log``.
    ``killed`` is False when it ended first; ``survivors`` counts the job's processes still
    running a second after the kill."""
    wanted = save_path / "checkpoints" / f"checkpoint-{step:09d}.pt"
    with open(log, "w", encoding="utf-8") as output, Stopwatch() as watch:
        job = subprocess.Popen(
            _command(config, processes), stdout=output, stderr=subprocess.STDOUT, text=True, env=_environment()
        )
        while job.poll() is None and not wanted.exists():
            time.sleep(POLL_S)
        killed = job.poll() is None
        # torchrun starts each worker in a session of its own and cannot pass SIGKILL on, so
        # killing it (or its process group) alone leaves the workers training: every process
        # of the job is stopped first, so that none reacts to another's end, then killed
        processes_of_job = [job.pid, *descendants(job.pid)] if killed else []
        for signal_number in (signal.SIGSTOP, signal.SIGKILL):
            for pid in processes_of_job:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal_number)
        exit_status = job.wait()
    return {
        "exit": exit_status,
        "seconds": watch.seconds,
        "killed": killed,
        "processes_killed": len(processes_of_job),
        "survivors": len(running_after(processes_of_job, wait_s=1.0)),
        "checkpoints": checkpoint_steps(save_path),
    }


def descendants(pid: int) -> list[int]:
    """The processes started by ``pid`` and by them, in any session (from ``/proc``: Linux)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (command) state ppid ...": the command may hold spaces and parentheses
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def running_after(pids: list[int], wait_s: float) -> list[int]:
    """Those of ``pids`` still running (neither gone nor a zombie) after up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        running = [pid for pid in pids if _running(pid)]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _command(config: Path, processes: int, *settings: str) -> list[str]:
    """``torchrun ... -m gears_ddp.launch --config config`` with ``--set`` for each of ``settings``."""
    sets = [word for setting in settings for word in ("--set", setting)]
    return torchrun_command(processes, "-m", "gears_ddp.launch", "--config", str(config), *sets)


def _environment() -> dict:
    """The jobs' environment: no launcher's variables, OpenMP threads that sleep when idle."""
    return job_environment({"OMP_WAIT_POLICY": "PASSIVE"})


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


def kill_and_resume(args, folder: Path, save_path: Path, logs: Path) -> dict:
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
    killed = kill_job(config, args.processes, save_path, args.kill_after, logs / "killed.log")
    resumed = run_job(config, args.processes, "args.resume_from=auto", logs / "resumed.log")
    resumed.update(report_figures(save_path), resumed_from=resumed_from(logs / "resumed.log"))
    if (save_path / "train.log").exists():
        shutil.copy(save_path / "train.log", logs / "train.log")
    return {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "processes": args.processes,
        "killed": killed,
        "resumed": resumed,
        "failures": failures(killed, resumed, args.kill_after, args.epochs),
    }


def failures(killed: dict, resumed: dict, kill_after: int, epochs: int) -> list[str]:
    """What went wrong, in words: the module docstring's checks."""
    found = []
    if not killed["killed"]:
        found.append(
            f"the first job ended (exit {killed['exit']}) before it was killed: give it more steps after "
            f"step {kill_after} (--epochs)"
        )
    if kill_after not in killed["checkpoints"] and not any(step > kill_after for step in killed["checkpoints"]):
        found.append(f"the killed job left no checkpoint of step {kill_after} or later ({killed['checkpoints']})")
    if killed["survivors"]:
        found.append(f"{killed['survivors']} process(es) of the killed job still ran a second after the kill")
    if resumed["exit"]:
        found.append(f"the resumed job exited with {resumed['exit']}")
    newest = f"checkpoint-{max(killed['checkpoints']):09d}.pt" if killed["checkpoints"] else None
    if (resumed["resumed_from"] or {}).get("checkpoint") != newest:
        found.append(f"the resumed job did not resume from the newest one, {newest} ({resumed['resumed_from']})")
    if resumed["epochs"] != epochs:
        found.append(f"the resumed job's report has {resumed['epochs']} epoch(s), not {epochs}")
    return found


def print_figures(figures: dict, shape: tuple[int, int]) -> None:
    killed, resumed = figures["killed"], figures["resumed"]
    where = resumed["resumed_from"]
    print(
        f"\ntorchrun --standalone --nproc_per_node={figures['processes']} -m gears_ddp.launch, "
        f"{figures['device']} rank(s); synthetic data {shape[0]:,} cells x {shape[1]:,} genes\n"
    )
    print_table(
        ["job", "exit", "seconds", "trained", "epochs in its report", "test pearson_delta"],
        [
            [
                "killed (SIGKILL to torchrun and its workers)",
                killed["exit"],
                f"{killed['seconds']:.1f}",
                f"to a checkpoint of step {max(killed['checkpoints'], default='none')}",
                "-",
                "-",
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
        f"\ncheckpoints the killed job left: steps {killed['checkpoints']}; the resumed job: "
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
    parser.add_argument(
        "--kill-after", type=int, default=30, help="the first job is killed once its checkpoint of this step is written"
    )
    parser.add_argument("--checkpoint-every", type=int, default=10, help="optimiser steps between checkpoints")
    parser.add_argument("--batch-size", type=int, default=32, help="cells per batch and process")
    add_size_arguments(parser)
    parser.add_argument("--data-path", default="./data/bench_resume")
    parser.add_argument("--logs", help="keep both jobs' output and the run's train.log in this folder")
    add_json_argument(parser)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.kill_after % args.checkpoint_every:
        parser.error("--kill-after must be a multiple of --checkpoint-every: no checkpoint of that step is written")

    folder = synthetic_folder(args.data_path, args)
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(args.logs) if args.logs else Path(tmp) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        figures = kill_and_resume(args, folder, Path(tmp) / "run", logs)
    with recorded(args.record):
        print_figures(figures, dataset_shape(folder))
    if args.json:
        write_figures(args.json, figures)
    if figures["failures"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
