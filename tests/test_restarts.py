"""Long runs on shared clusters: checkpoints every step, exact resume after SIGKILL at any
moment, stop signals to one rank, a lost rank, torchrun restarts and Slurm requeues; all
with real processes and real signals (gloo on CPU)."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_launch import _clean_environment, _launch_arguments, _report

from gears_ddp import PertData, train_multi_gpu
from gears_ddp.gears import GEARS
from gears_ddp.launching.environments import find_free_port
from gears_ddp.model.model_folder import read_weights
from gears_ddp.runtime.stopping import EXIT_INTERRUPTED, TrainingInterrupted
from gears_ddp.training.checkpoint import checkpoint_files, latest_checkpoint, load_training_checkpoint

SPLIT = {"split": "simulation", "seed": 1}
SCRIPTS = Path(__file__).parent / "scripts"
TRAIN = str(SCRIPTS / "train.py")


def _without_seconds(history):
    return [{k: v for k, v in record.items() if not k.endswith("seconds")} for record in history]


def _single(data_folder, **options):
    """GEARS.train in this process, as scripts/train.py does it."""
    pert_data = PertData(data_folder)
    pert_data.load(data_path=data_folder / "toy")
    pert_data.prepare_split(**SPLIT)
    pert_data.get_dataloader(options.pop("batch_size"), test_batch_size=32)
    torch.manual_seed(0)
    gears = GEARS(pert_data)
    gears.model_initialize(hidden_size=8)
    return gears.train(**{"report_pictures": False, **options})


def _multi(data_folder, **options):
    return train_multi_gpu(
        data_folder,
        "toy",
        SPLIT,
        {
            "cpu_processes": 2,
            "test_batch_size": 32,
            "model_config": {"hidden_size": 8},
            "report_pictures": False,  # drawn where a test looks at them (tests/test_report_pictures.py)
            **options,
        },
    )


def _start(mode, data_folder, **options):
    return subprocess.Popen(
        [sys.executable, TRAIN, mode, str(data_folder), json.dumps(options)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_environment(),
    )


def _wait_for_step(save_path, step, process, timeout_s=240):
    """Wait until a checkpoint at or past optimiser step ``step`` exists."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = checkpoint_files(save_path)
        if files and int(files[-1].stem.split("-")[1]) >= step:
            return
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint at step {step} within {timeout_s} s")


def _ranks_at_step(data_folder, save_path, step, **options):
    """A two-rank run (``train_multi_gpu`` in a subprocess) into ``save_path``, once it has
    written a checkpoint at or past optimiser step ``step``: the process and its ranks' pids."""
    process = _start("multi", data_folder, save_path=str(save_path), **options)
    _wait_for_step(save_path, step, process)
    return process, _ranks(process.pid)


def _ranks(pid):
    """The worker processes train_multi_gpu spawned from process ``pid``, in rank order."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    children = [int(c) for c in path.read_text().split()] if path.exists() else []
    return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def _assert_same_run(resumed, whole):
    assert _without_seconds(resumed["history"]) == _without_seconds(whole["history"])
    assert resumed["model"] == whole["model"] and resumed["baselines"] == whole["baselines"]
    assert resumed["best_epoch"] == whole["best_epoch"]
    assert resumed["parameter_digests"] == whole["parameter_digests"]  # the last epoch's weights
    best = [read_weights(report["model_path"]) for report in (resumed, whole)]
    for name, tensor in best[1].items():
        assert torch.equal(best[0][name], tensor), name


@pytest.mark.distributed
@pytest.mark.slow
def test_killed_at_any_moment_and_resumed_the_run_is_bit_identical(data_folder, tmp_path):
    options = {"epochs": 3, "batch_size": 16, "checkpoint_every_steps": 1}
    whole = _single(data_folder, save_path=str(tmp_path / "whole"), **options)
    steps_per_epoch = load_training_checkpoint(checkpoint_files(tmp_path / "whole")[-1])["position"]["global_step"] // 3
    for kill_at in (steps_per_epoch + 2, 2 * steps_per_epoch):  # mid-epoch, and at an epoch's last step
        save_path = tmp_path / f"killed_at_{kill_at}"
        process = _start("single", data_folder, save_path=str(save_path), **options)
        _wait_for_step(save_path, kill_at, process)
        process.kill()
        process.wait()
        stopped = latest_checkpoint(save_path)[1]["position"]
        assert stopped["global_step"] < 3 * steps_per_epoch
        resumed = _single(data_folder, save_path=str(save_path), resume_from="auto", **options)
        _assert_same_run(resumed, whole)


@pytest.mark.distributed
@pytest.mark.slow
def test_a_stop_signal_to_one_rank_stops_both_with_a_checkpoint_and_the_run_resumes_exactly(data_folder, tmp_path):
    options = {"epochs": 2, "batch_size": 8, "checkpoint_every_steps": 4}
    whole = _multi(data_folder, save_path=str(tmp_path / "whole"), **options)
    save_path = tmp_path / "stopped"
    process, ranks = _ranks_at_step(data_folder, save_path, 4, **options)
    os.kill(ranks[-1], signal.SIGUSR1)  # one rank only: the other must stop with it
    _, stderr = process.communicate(timeout=120)
    assert process.returncode != 0
    assert "TrainingInterrupted: training stopped on SIGUSR1" in stderr and "resume_from='auto'" in stderr
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks)
    position = latest_checkpoint(save_path)[1]["position"]
    assert 4 <= position["global_step"] and len(position["epoch_loss_sums"]) in (0, 2)
    resumed = _multi(data_folder, save_path=str(save_path), resume_from="auto", **options)
    _assert_same_run(resumed, whole)


def test_a_stop_signal_in_one_process_stops_with_a_checkpoint_and_the_run_resumes_exactly(
    data_folder, tmp_path, monkeypatch
):
    import gears_ddp.training.recipe as recipe

    options = {"epochs": 2, "batch_size": 16}
    whole = _single(data_folder, save_path=str(tmp_path / "whole"), **options)
    steps = recipe.optimizer_steps

    def steps_then_signal(*args, **kwargs):
        for number, loss in enumerate(steps(*args, **kwargs), start=1):
            yield loss
            if number == 5:
                os.kill(os.getpid(), signal.SIGTERM)  # what Slurm or torchrun sends; step 6 still runs

    monkeypatch.setattr(recipe, "optimizer_steps", steps_then_signal)
    save_path = tmp_path / "stopped"
    with pytest.raises(TrainingInterrupted, match="stopped on SIGTERM in epoch 1, after optimiser step 6") as stop:
        _single(data_folder, save_path=str(save_path), **options)
    assert stop.value.signal_name == "SIGTERM" and Path(stop.value.checkpoint).is_file()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler was removed
    last = (save_path / "train.log").read_text().strip().splitlines()[-1]  # the log says how the run ended
    assert " WARNING " in last and "training stopped on SIGTERM in epoch 1, after optimiser step 6" in last
    assert stop.value.checkpoint in last
    monkeypatch.setattr(recipe, "optimizer_steps", steps)
    resumed = _single(data_folder, save_path=str(save_path), resume_from="auto", **options)
    _assert_same_run(resumed, whole)


@pytest.mark.distributed
def test_a_killed_rank_fails_the_run_quickly_naming_it(data_folder, tmp_path):
    save_path = tmp_path / "run"
    process, ranks = _ranks_at_step(data_folder, save_path, 2, epochs=50, batch_size=8, checkpoint_every_steps=2)
    assert len(ranks) >= 2
    killed_at = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    assert time.monotonic() - killed_at < 60
    assert process.returncode != 0 and "rank 1 of 2 was killed by SIGKILL" in stderr
    # the error naming the rank is the last thing shown: no warning of semaphores the killed rank left
    assert "leaked semaphore" not in stderr
    assert stderr.rstrip().splitlines()[-1] == "(the cause: rank 1 of 2 was killed by SIGKILL)"
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks)
    path, state = latest_checkpoint(save_path)
    assert state["position"]["global_step"] >= 2 and path.stat().st_size > 0


def _torchrun(data_folder, save_path, script, max_restarts=0, **extra_environment):
    config = _launch_arguments(data_folder, save_path, epochs=2, checkpoint_every_steps=1)[-2:]  # --config FILE
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        f"--max-restarts={max_restarts}",
        script,
        *config,
    ]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=_clean_environment(**extra_environment)
    )


@pytest.mark.distributed
@pytest.mark.slow
def test_a_restarted_torchrun_job_ends_with_the_weights_of_an_uninterrupted_one(data_folder, tmp_path):
    whole = _torchrun(data_folder, tmp_path / "whole", str(SCRIPTS / "launch_dying_once.py"), DIE_AFTER_STEPS=10**6)
    assert whole.returncode == 0, whole.stderr[-3000:]
    restarted = _torchrun(
        data_folder, tmp_path / "restarted", str(SCRIPTS / "launch_dying_once.py"), max_restarts=1, DIE_AFTER_STEPS=6
    )
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "resuming from" in restarted.stderr  # the restarted workers continued from a checkpoint
    reports = [_report(tmp_path / name) for name in ("whole", "restarted")]
    assert reports[0]["parameter_digests"] == reports[1]["parameter_digests"]
    assert reports[0]["model"] == reports[1]["model"]
    best = [read_weights(tmp_path / name) for name in ("whole", "restarted")]
    assert all(torch.equal(best[0][name], best[1][name]) for name in best[0])


@pytest.mark.distributed
def test_slurm_sigusr1_checkpoints_requeues_and_the_job_continues(data_folder, tmp_path):
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    requeued = tmp_path / "requeued.txt"
    (bin_folder / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {requeued}\n')
    (bin_folder / "scontrol").chmod(0o755)
    save_path = tmp_path / "run"
    arguments = _launch_arguments(data_folder, save_path, epochs=2, checkpoint_every_steps=1, resume_from="auto")

    def tasks():
        port = find_free_port()
        return [
            subprocess.Popen(
                [sys.executable, *arguments],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_clean_environment(
                    SLURM_PROCID=rank,
                    SLURM_NTASKS=2,
                    SLURM_LOCALID=rank,
                    SLURM_NODEID=0,
                    SLURM_STEP_TASKS_PER_NODE=2,
                    SLURM_JOB_ID=42,
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=port,
                    PATH=f"{bin_folder}:{os.environ['PATH']}",
                ),
            )
            for rank in (0, 1)
        ]

    first = tasks()
    _wait_for_step(save_path, 3, first[0])
    os.kill(first[0].pid, signal.SIGUSR1)
    outputs = [task.communicate(timeout=120) for task in first]
    assert [task.returncode for task in first] == [EXIT_INTERRUPTED, EXIT_INTERRUPTED], outputs[0][1][-3000:]
    assert requeued.read_text().split() == ["requeue", "42"]
    assert "stopped on SIGUSR1" in outputs[0][1]
    again = tasks()  # the requeued job starts over with the same command
    outputs = [task.communicate(timeout=300) for task in again]
    assert [task.returncode for task in again] == [0, 0], outputs[0][1][-3000:]
    assert "resuming from" in outputs[0][1]
    assert _report(save_path)["best_epoch"] in (1, 2)


def test_checkpoint_history_keeps_the_last_k_and_skips_an_unreadable_latest(toy, tmp_path, caplog):
    toy.get_dataloader(16)

    def train(**options):
        torch.manual_seed(0)
        gears = GEARS(toy)
        gears.model_initialize(hidden_size=8)
        return gears.train(epochs=1, save_path=str(tmp_path), **options)

    train(checkpoint_every_steps=1, keep_checkpoints=2)
    files = checkpoint_files(tmp_path)
    steps = [int(p.stem.split("-")[1]) for p in files]
    assert len(files) == 2 and steps[1] == steps[0] + 1
    files[-1].write_bytes(files[-1].read_bytes()[:100])  # a truncated latest checkpoint
    (files[-1].parent / f"checkpoint-{steps[1] + 1:09d}.pt").mkdir()  # a folder named like a newer one
    caplog.set_level(logging.INFO, logger="gears_ddp")
    path, state = latest_checkpoint(tmp_path)
    assert path == files[0] and state["position"]["global_step"] == steps[0]
    assert any(r.levelname == "WARNING" and str(files[-1]) in r.getMessage() for r in caplog.records)
    report = train(resume_from="auto")
    assert f"resuming from {files[0]}" in caplog.text and len(report["history"]) == 1


def test_a_missing_checkpoint_fails_before_any_process_starts(data_folder, tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    monkeypatch.setattr(mp, "spawn", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(FileNotFoundError, match=r"args\['resume_from'\]='.*nothing.pt': no such checkpoint"):
        _multi(data_folder, save_path=str(tmp_path), resume_from=str(tmp_path / "nothing.pt"))
    with pytest.raises(ValueError, match=r"args\['resume_from'\]='auto' needs args\['save_path'\]"):
        _multi(data_folder, save_path=None, resume_from="auto")
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=f"cannot read training checkpoint {tmp_path / 'notes.pt'}: .*damaged"):
        _multi(data_folder, save_path=str(tmp_path), resume_from=str(tmp_path / "notes.pt"))


def test_a_run_stopped_right_after_its_last_optimiser_step_resumes_to_the_same_report(toy, tmp_path):
    """A checkpoint written at the step where ``max_steps`` is reached (a stop signal or a
    kill can leave that one last) is before the epoch's evaluation: resumed, the run still
    evaluates that epoch and ends as the uninterrupted run did."""
    toy.get_dataloader(16)

    def train(save_path, **options):
        torch.manual_seed(0)
        gears = GEARS(toy)
        gears.model_initialize(hidden_size=8)
        return gears.train(
            epochs=3, save_path=str(save_path), checkpoint_every_steps=1, keep_checkpoints=100, **options
        )

    whole = train(tmp_path / "whole")
    steps_per_epoch = latest_checkpoint(tmp_path / "whole")[1]["position"]["global_step"] // 3
    max_steps = steps_per_epoch + 2  # in epoch 2
    whole = train(tmp_path / "whole_max", max_steps=max_steps)
    assert len(whole["history"]) == 2
    last_step = next(p for p in checkpoint_files(tmp_path / "whole_max") if int(p.stem.split("-")[1]) == max_steps)
    stopped = tmp_path / "stopped"
    (stopped / last_step.parent.name).mkdir(parents=True)
    (stopped / last_step.parent.name / last_step.name).write_bytes(last_step.read_bytes())
    resumed = train(stopped, max_steps=max_steps, resume_from="auto")
    _assert_same_run(resumed, whole)
