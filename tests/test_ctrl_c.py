"""Ctrl-C stops a training run as SIGTERM does: every rank at the next optimiser step, after a
checkpoint, and the run resumes exactly; a second Ctrl-C stops at once. In one process and
with spawned ranks, Ctrl-C to the whole process group (a terminal) or to the parent only (a
notebook); real signals, real processes (gloo on CPU)."""

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_launch import _clean_environment, _launch_arguments, _run_script
from test_restarts import _assert_same_run, _ranks, _ranks_at_step, _single, _wait_for_step

from gears_ddp.launching.supervisor import spawn_workers
from gears_ddp.runtime.stopping import CTRL_C_NOTICE, EXIT_INTERRUPTED, StopSignals, TrainingInterrupted
from gears_ddp.training.checkpoint import checkpoint_files, latest_checkpoint

TESTS = Path(__file__).parent


def _signal_after_step(monkeypatch, step: int, presses: int) -> None:
    """Send this process ``presses`` Ctrl-Cs after optimiser step ``step`` of each epoch."""
    import gears_ddp.training.recipe as recipe

    steps = recipe.optimizer_steps

    def steps_then_ctrl_c(*args, **kwargs):
        for number, loss in enumerate(steps(*args, **kwargs), start=1):
            yield loss
            if number == step:
                for _ in range(presses):
                    os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(recipe, "optimizer_steps", steps_then_ctrl_c)


def _assert_ctrl_c_as_usual() -> None:
    """This process's Ctrl-C raises KeyboardInterrupt, as it does in a Python session."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)


def test_ctrl_c_in_one_process_stops_with_a_checkpoint_and_the_run_resumes_exactly(
    data_folder, tmp_path, monkeypatch, caplog
):
    options = {"epochs": 2, "batch_size": 16}
    whole = _single(data_folder, save_path=str(tmp_path / "whole"), **options)
    _signal_after_step(monkeypatch, 5, presses=1)
    save_path = tmp_path / "stopped"
    with pytest.raises(
        TrainingInterrupted, match=r"stopped on SIGINT \(Ctrl-C\) in epoch 1, after optimiser step 6"
    ) as stop:
        _single(data_folder, save_path=str(save_path), **options)
    assert stop.value.signal_name == "SIGINT" and Path(stop.value.checkpoint).is_file()
    assert caplog.text.count(CTRL_C_NOTICE) == 1
    _assert_ctrl_c_as_usual()  # the handler was removed
    last = (save_path / "train.log").read_text().strip().splitlines()[-1]  # the log says how the run ended
    assert " WARNING " in last and "training stopped on SIGINT (Ctrl-C) in epoch 1, after optimiser step 6" in last
    monkeypatch.undo()
    resumed = _single(data_folder, save_path=str(save_path), resume_from="auto", **options)
    _assert_same_run(resumed, whole)


def test_a_second_ctrl_c_in_one_process_stops_at_once(data_folder, tmp_path, monkeypatch, caplog):
    _signal_after_step(monkeypatch, 3, presses=2)
    save_path = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        _single(data_folder, save_path=str(save_path), epochs=2, batch_size=16)
    assert caplog.text.count(CTRL_C_NOTICE) == 1  # the first press said what the second does
    assert checkpoint_files(save_path) == []  # not even the stop's checkpoint: at once
    assert (save_path / "train.log").read_text().strip().splitlines()[-1].endswith("stopped by Ctrl-C")
    _assert_ctrl_c_as_usual()


def test_the_ctrl_c_handler_is_restored_after_training(data_folder, tmp_path, monkeypatch):
    import gears_ddp.training.recipe as recipe

    steps, during = recipe.optimizer_steps, []

    def steps_reading_the_handler(*args, **kwargs):
        for loss in steps(*args, **kwargs):
            during.append(signal.getsignal(signal.SIGINT))
            yield loss

    monkeypatch.setattr(recipe, "optimizer_steps", steps_reading_the_handler)
    _single(data_folder, save_path=str(tmp_path / "run"), epochs=1, batch_size=16)
    assert during and signal.default_int_handler not in during  # Ctrl-C stopped at a step meanwhile
    _assert_ctrl_c_as_usual()


def _gears_ddp_train(data_folder, save_path, **args) -> subprocess.Popen:
    """``gears-ddp train`` with 2 CPU ranks, in a session of its own (its process group: a
    terminal's foreground job)."""
    config = _launch_arguments(data_folder, save_path, cpu_processes=2, **args)[-1]
    return subprocess.Popen(
        [sys.executable, "-m", "gears_ddp", "train", "--config", config],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_environment(),
        start_new_session=True,
    )


@pytest.mark.distributed
def test_ctrl_c_to_the_process_group_of_spawned_ranks_exits_75_with_one_line_and_a_checkpoint(data_folder, tmp_path):
    save_path = tmp_path / "run"
    process = _gears_ddp_train(data_folder, save_path, epochs=3, checkpoint_every_steps=2)
    _wait_for_step(save_path, 4, process)
    ranks = _ranks(process.pid)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == EXIT_INTERRUPTED, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.count(CTRL_C_NOTICE) == 1  # one press, read once
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("gears-ddp train: training stopped on SIGINT (Ctrl-C) in epoch")
    checkpoint = last.split("checkpoint ")[1].split(";")[0]
    assert Path(checkpoint) == latest_checkpoint(save_path)[0]
    assert "training stopped on SIGINT (Ctrl-C)" in (save_path / "train.log").read_text().strip().splitlines()[-1]
    assert ranks and not any(Path(f"/proc/{pid}").exists() for pid in ranks)


@pytest.mark.distributed
def test_ctrl_c_to_the_parent_only_is_passed_on_to_the_spawned_ranks(data_folder, tmp_path):
    save_path = tmp_path / "run"
    process, ranks = _ranks_at_step(data_folder, save_path, 4, epochs=3, batch_size=8, checkpoint_every_steps=2)
    os.kill(process.pid, signal.SIGINT)  # what a notebook's interrupt sends
    _, stderr = process.communicate(timeout=120)
    assert "TrainingInterrupted: training stopped on SIGINT (Ctrl-C)" in stderr, stderr[-3000:]
    position = latest_checkpoint(save_path)[1]["position"]
    assert position["global_step"] >= 4 and len(position["epoch_loss_sums"]) in (0, 2)
    assert ranks and not any(Path(f"/proc/{pid}").exists() for pid in ranks)


def _waiting_for_a_step(local_rank, folder, messages):
    """A rank whose next step boundary is far: a first Ctrl-C is recorded, not acted on. It
    says (a file in ``folder``) when it waits."""
    with StopSignals():
        (Path(folder) / str(local_rank)).touch()
        time.sleep(120)


def _wait_for_files(folder: Path, count: int) -> None:
    deadline = time.monotonic() + 60
    while len(list(folder.iterdir())) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def _ctrl_c_twice_once_waiting(folder: Path, workers: int, waiting: list) -> threading.Thread:
    """A thread that presses Ctrl-C (to this process) once ``workers`` children wait for their
    step, and, if they still run 2 s later (``waiting`` says whether they did), again."""

    def press():
        _wait_for_files(folder, workers)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)
        waiting.append(len(multiprocessing.active_children()) >= workers)
        if waiting[0]:
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=press, daemon=True)
    thread.start()
    return thread


@pytest.mark.distributed
def test_a_second_ctrl_c_to_the_parent_ends_the_spawned_workers_at_once(tmp_path):
    started, handler, waiting = time.monotonic(), signal.getsignal(signal.SIGINT), []
    presses = _ctrl_c_twice_once_waiting(tmp_path, 2, waiting)
    with pytest.raises(KeyboardInterrupt):
        spawn_workers(_waiting_for_a_step, (str(tmp_path),), 2)
    presses.join(10)
    assert waiting == [True]  # the first press was passed on, not acted on at once
    assert time.monotonic() - started < 60  # not the workers' 120 s
    assert multiprocessing.active_children() == []
    assert signal.getsignal(signal.SIGINT) == handler


def test_only_a_process_that_ignores_ctrl_c_takes_it_passed_on():
    """SIGUSR2 means a parent's Ctrl-C only to the workers the parent spawned (they ignore
    SIGINT); a process that reads Ctrl-C itself leaves SIGUSR2 to whoever set it."""
    own = signal.getsignal(signal.SIGUSR2)
    with StopSignals():
        assert signal.getsignal(signal.SIGUSR2) == own and signal.getsignal(signal.SIGINT) != signal.default_int_handler
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a spawned worker
    try:
        with StopSignals() as stops:
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stops.received == signal.SIGINT  # a Ctrl-C, passed on
        assert signal.getsignal(signal.SIGUSR2) == own
    finally:
        signal.signal(signal.SIGINT, previous)


def _sleeping(local_rank, argument, messages):
    time.sleep(60)


@pytest.mark.distributed
def test_a_stop_while_the_workers_start_ends_them_without_a_word_from_them(tmp_path):
    """SIGTERM to the parent alone while it writes the workers' arguments (a large one: a
    long write) stops it there in one line; it used to leave each worker reading half its
    arguments ('pickle data was truncated', a traceback per worker)."""
    script = tmp_path / "driver.py"
    script.write_text(
        f"import os, signal, sys, threading, time; sys.path.insert(0, {str(TESTS)!r})\n"
        "from gears_ddp.data.stop_signals import Stopped, stops_raised\n"
        "from gears_ddp.launching.supervisor import SpawnedWorkers\n"
        "from gears_ddp.runtime.stopping import CTRL_C, STOP_SIGNALS\n"
        "from test_ctrl_c import _sleeping\n"
        "if __name__ == '__main__':\n"
        "    with stops_raised((CTRL_C, *STOP_SIGNALS)):\n"
        "        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
        "        try:\n"
        "            SpawnedWorkers(_sleeping, (b'x' * 50_000_000,), 2).close()\n"
        "        except Stopped:\n"
        "            print('stopped while starting', file=sys.stderr); sys.exit(75)\n"
    )
    done = _run_script(script)
    assert done.returncode == EXIT_INTERRUPTED, done.stderr[-3000:]
    assert done.stderr.strip() == "stopped while starting"  # no worker's traceback


def _waiting_without_stops(local_rank, folder, messages):
    """A worker that reads no stop (a pair screen's): the Ctrl-C passed on ends it."""
    (Path(folder) / str(local_rank)).touch()
    time.sleep(120)


@pytest.mark.distributed
def test_a_first_ctrl_c_says_what_it_does_to_the_workers_work(tmp_path, caplog):
    """Workers of other work than training (a pair screen's) are stopped in its words, not in
    training's (a step, a checkpoint)."""

    def press():
        _wait_for_files(tmp_path, 2)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press, daemon=True).start()
    with caplog.at_level(logging.INFO, logger="gears_ddp"), pytest.raises(TrainingInterrupted) as stop:
        spawn_workers(_waiting_without_stops, (str(tmp_path),), 2, ctrl_c_notice="Ctrl-C: NOTICE", ended="ENDED")
    assert str(stop.value) == "stopped by SIGINT (Ctrl-C), passed on to the 2 worker process(es), ENDED"
    assert caplog.text.count("Ctrl-C: NOTICE") == 1 and CTRL_C_NOTICE not in caplog.text
    assert multiprocessing.active_children() == []


@pytest.mark.distributed
def test_a_second_ctrl_c_to_the_process_group_ends_the_parent_and_its_workers_at_once(tmp_path):
    script, waiting = tmp_path / "driver.py", tmp_path / "waiting"
    waiting.mkdir()
    driver = (
        f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
        "from gears_ddp.launching.supervisor import spawn_workers\n"
        "from test_ctrl_c import _waiting_for_a_step\n"
        "if __name__ == '__main__':\n"
        f"    spawn_workers(_waiting_for_a_step, ({str(waiting)!r},), 2)\n"
    )
    script.write_text(driver)
    process = subprocess.Popen(
        [sys.executable, str(script)],
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_environment(),
        start_new_session=True,
    )
    _wait_for_files(waiting, 2)
    workers = _ranks(process.pid)
    os.killpg(process.pid, signal.SIGINT)
    time.sleep(2)
    assert process.poll() is None, process.communicate()[1][-3000:]  # the first press: waiting for the step
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGINT and "KeyboardInterrupt" in stderr
    assert len(workers) == 2 and not any(Path(f"/proc/{pid}").exists() for pid in workers)


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_to_a_screen_in_this_process_exits_75_with_one_line(monkeypatch, capsys, signal_number):
    """A screen of one device runs in this process: a stop ended it with a traceback (Ctrl-C,
    exit 130) or without a word (SIGTERM, 143)."""
    from gears_ddp.cli import main, pair_screen

    def screening(options):
        os.kill(os.getpid(), signal_number)
        time.sleep(30)
        raise AssertionError("the stop did not stop the command")

    monkeypatch.setattr(pair_screen, "run", screening)
    assert main(["screen", "--run", "run", "--genes", "A", "B", "--out", "s.csv"]) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert err == (
        f"gears-ddp screen: stopped by {signal.Signals(signal_number).name}: the chunks finished so far are kept "
        "beside the table; run the same command again to continue\n"
    )
    _assert_ctrl_c_as_usual()


def test_ctrl_c_outside_the_training_steps_exits_75_with_one_line(monkeypatch, capsys):
    from gears_ddp.cli import main, train

    def preparing(options):  # Ctrl-C lands while the command prepares its run
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
        raise AssertionError("Ctrl-C did not stop the command")

    monkeypatch.setattr(train, "run", preparing)
    assert main(["train", "--config", "run.yaml"]) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert err.startswith("gears-ddp train: stopped by SIGINT outside the training steps") and err.count("\n") == 1
    _assert_ctrl_c_as_usual()


def test_ctrl_c_to_a_one_process_gears_ddp_train_exits_75_with_a_checkpoint(data_folder, tmp_path):
    save_path = tmp_path / "run"
    config = _launch_arguments(data_folder, save_path, cpu_processes=1, epochs=3, checkpoint_every_steps=2)[-1]
    process = subprocess.Popen(
        [sys.executable, "-m", "gears_ddp", "train", "--config", config],
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_environment(),
        start_new_session=True,
    )
    _wait_for_step(save_path, 4, process)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == EXIT_INTERRUPTED, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.count(CTRL_C_NOTICE) == 1
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("gears-ddp train: training stopped on SIGINT (Ctrl-C) in epoch")
    assert Path(last.split("checkpoint ")[1].split(";")[0]) == latest_checkpoint(save_path)[0]
