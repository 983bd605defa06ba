"""The worker-to-parent message channel: whole messages arrive, a dead writer never hangs the parent;
workers ended by the stop signal their parent passed on are a stop, not a failure."""

import multiprocessing
import os
import pickle
import signal
import tempfile
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp

from gears_ddp.launching.supervisor import DistributedTrainingError, spawn_workers
from gears_ddp.launching.worker_messages import WorkerMessages
from gears_ddp.runtime.stopping import TrainingInterrupted

pytestmark = pytest.mark.distributed

BIG = 3 * 2**20 // 4  # float32 values in a 3 MiB tensor: far more than a pipe holds


def _put_big_messages(local_rank, messages):
    for part in range(3):
        messages.put((local_rank, part, torch.arange(BIG, dtype=torch.float32) + local_rank * 10 + part))


def _die_while_writing(local_rank, messages):
    messages.put(("started", local_rank))
    if local_rank == 1:
        # what a rank killed part-way through a message leaves in the pipe: a frame header
        # promising 1000 bytes, and 10 of them
        os.write(messages._writer.fileno(), (1000).to_bytes(8, "big") + b"x" * 10)
        os.kill(os.getpid(), signal.SIGKILL)


def _spawn_with_deadline(worker, deadline_s=120):
    """spawn_workers in a thread, so that a hang fails the test instead of stalling the suite."""
    outcome = {}

    def run():
        try:
            outcome["messages"] = spawn_workers(worker, (), 2)
        except BaseException as err:  # handed to the test thread
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline_s)
    assert not thread.is_alive(), f"spawn_workers still waiting after {deadline_s} s"
    return outcome


def test_messages_larger_than_the_pipe_arrive_whole_and_in_order():
    outcome = _spawn_with_deadline(_put_big_messages)
    messages = outcome["messages"]
    assert sorted((rank, part) for rank, part, _ in messages) == [(r, p) for r in range(2) for p in range(3)]
    for rank in range(2):
        assert [part for r, part, _ in messages if r == rank] == [0, 1, 2]
    for rank, part, tensor in messages:
        assert torch.equal(tensor, torch.arange(BIG, dtype=torch.float32) + rank * 10 + part)


def test_a_rank_killed_in_the_middle_of_a_message_fails_the_run_instead_of_hanging_it():
    outcome = _spawn_with_deadline(_die_while_writing)
    assert "messages" not in outcome
    with pytest.raises(DistributedTrainingError, match=r"rank 1 of 2 was killed by SIGKILL"):
        raise outcome["error"]


def _raise_before_reporting(local_rank, messages):
    raise ValueError(f"no data on rank {local_rank}")


def test_a_failed_workers_traceback_reaches_the_parent_and_its_file_is_deleted(tmp_path, monkeypatch):
    """``mp.spawn`` has a failed worker write its traceback to a file in the temporary folder
    and deletes it only in its own ``join``: the supervisor reads it, then deletes it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mp.spawn makes the files
    outcome = _spawn_with_deadline(_raise_before_reporting)
    with pytest.raises(DistributedTrainingError, match=r"(?s)rank [01] of 2 failed.*no data on rank"):
        raise outcome["error"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("byte_stream", [True, False])
def test_both_ways_of_reading_the_pipe_return_each_message_once_in_order(byte_stream):
    messages = WorkerMessages(mp.get_context("spawn"), byte_stream=byte_stream)
    try:
        assert messages.receive() == []
        messages.put(("report", {"mse": 0.5}))
        messages.put(torch.arange(4.0))
        first, second = messages.receive()
        assert first == ("report", {"mse": 0.5}) and torch.equal(second, torch.arange(4.0))
        assert messages.receive() == []
    finally:
        messages.close()


def test_a_half_written_frame_is_kept_until_the_rest_arrives():
    messages = WorkerMessages(mp.get_context("spawn"))
    try:
        messages.put("whole")
        payload = pickle.dumps("second")
        os.write(messages._writer.fileno(), len(payload).to_bytes(8, "big") + payload[:3])
        assert messages.receive() == ["whole"]  # returns at once: the half frame is not waited for
        os.write(messages._writer.fileno(), payload[3:])
        assert messages.receive() == ["second"]
    finally:
        messages.close()


def _log_from_each_rank(local_rank, messages):
    from gears_ddp._logging import get_logger

    messages.forward_logs(local_rank)
    logger = get_logger("gears_ddp.worker_test")
    logger.info("progress of rank %d", local_rank)
    logger.warning("warning of rank %d", local_rank)
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failure of rank %d", local_rank)
    messages.put(("done", local_rank))


def test_worker_log_records_reach_the_parents_loggers(caplog):
    """Spawned processes do not inherit the parent's logging set-up: their records are
    forwarded and replayed, rank 0's from the parent's level, other ranks' warnings and
    errors with the rank named, tracebacks as text."""
    caplog.set_level("INFO", logger="gears_ddp")
    received = spawn_workers(_log_from_each_rank, (), 2)
    assert sorted(received) == [("done", 0), ("done", 1)]  # log records are not returned
    records = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.name == "gears_ddp.worker_test"]
    assert ("gears_ddp.worker_test", "INFO", "progress of rank 0") in records
    assert ("gears_ddp.worker_test", "WARNING", "warning of rank 0") in records
    assert ("gears_ddp.worker_test", "WARNING", "rank 1: warning of rank 1") in records
    assert not any("progress of rank 1" in message for _, _, message in records)
    failure = next(message for _, level, message in records if level == "ERROR" and "rank 1" in message)
    assert failure.startswith("rank 1: failure of rank 1") and "ValueError: boom" in failure


def test_worker_log_records_follow_the_parents_level(caplog):
    caplog.set_level("WARNING", logger="gears_ddp")
    spawn_workers(_log_from_each_rank, (), 2)
    messages = [r.getMessage() for r in caplog.records if r.name == "gears_ddp.worker_test"]
    assert "warning of rank 0" in messages and "progress of rank 0" not in messages


class _ExitingBetweenReadings:
    """A worker process that is running at the first reading of its exit code and has
    exited with code 1 at every later one (it failed while the parent looked)."""

    def __init__(self):
        self.readings = 0

    @property
    def exitcode(self):
        self.readings += 1
        return None if self.readings == 1 else 1


def test_a_worker_exiting_while_the_parent_looks_is_seen_as_failed():
    from gears_ddp.launching.supervisor import SpawnedWorkers

    workers = SpawnedWorkers.__new__(SpawnedWorkers)  # the watching part alone, no process started
    workers.processes, workers.received, workers.failed = [_ExitingBetweenReadings()], [], []
    workers.collect = lambda: []
    assert not workers.finished()  # running when looked at: not finished, not failed
    assert workers.finished() and workers.failed == [(0, 1)]


def _sleep_unguarded(local_rank, messages):
    time.sleep(120)  # no stop handler: a SIGTERM ends it, as one still starting


def _signal_once_started(number: int, workers: int) -> threading.Thread:
    """A thread that sends this process ``number`` once ``workers`` children run."""

    def send():
        deadline = time.monotonic() + 60
        while len(multiprocessing.active_children()) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        os.kill(os.getpid(), number)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_workers_ended_by_the_stop_signal_passed_on_to_them_are_a_stop_not_a_lost_rank():
    started, handler = time.monotonic(), signal.getsignal(signal.SIGTERM)
    _signal_once_started(signal.SIGTERM, 2)
    with pytest.raises(TrainingInterrupted, match="stopped by SIGTERM, passed on to the 2 worker process") as stop:
        spawn_workers(_sleep_unguarded, (), 2)
    assert stop.value.signal_name == "SIGTERM" and stop.value.checkpoint is None
    assert time.monotonic() - started < 60  # not the sleepers' 120 s
    assert multiprocessing.active_children() == []
    assert signal.getsignal(signal.SIGTERM) == handler  # the supervisor's handler gone again
