"""Supervising spawned worker processes: start them with ``torch.multiprocessing.spawn`` (on
Linux they end with the process that spawned them), watch them without blocking, hand their
log records to this process's loggers, pass stop signals on (Ctrl-C included: the workers
ignore SIGINT, and this process reads it for them), and turn a failure into one error that
names the rank that failed first, with its traceback. ``train_multi_gpu``, ``train_replicates`` and
screens use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path

import torch.multiprocessing as mp

from gears_ddp.data.io import loads_plain_data
from gears_ddp.launching.worker_messages import LogRecord, WorkerFailed, WorkerMessages, replay_log
from gears_ddp.runtime.process_end import heap_frozen_for_exit
from gears_ddp.runtime.stopping import (
    CTRL_C,
    CTRL_C_NOTICE,
    ENDED_TRAINING,
    STOP_SIGNALS,
    TrainingInterrupted,
    announce_ctrl_c,
    described_signal,
    passed_on_as,
    signal_name,
)
from gears_ddp.runtime.threads import passive_openmp_environment

PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): the signal a process gets when its parent ends
SHUTDOWN_GRACE_S = 5.0  # after a rank fails, how long the others get to stop before they are ended


class DistributedTrainingError(RuntimeError):
    """A worker process failed; the message holds its rank and traceback."""


def spawn_workers(
    worker,
    worker_args: tuple,
    nprocs: int,
    poll_s: float = 0.2,
    ctrl_c_notice: str = CTRL_C_NOTICE,
    ended: str = ENDED_TRAINING,
) -> list:
    """``mp.spawn`` ``worker(local_rank, *worker_args, messages)`` and return what the workers
    ``messages.put`` (a :class:`WorkerMessages`), except their log records, which go to this
    process's loggers as they arrive.

    SIGTERM and SIGUSR1 sent to this process while the workers run are passed on to them (a
    scheduler's warning reaches every rank), and so is a first Ctrl-C (``signals_passed_on``);
    a second raises ``KeyboardInterrupt`` here, and the workers are ended. A failed worker raises the
    :class:`DistributedTrainingError` of :meth:`SpawnedWorkers.result`, except workers that
    the passed-on signal ended before they could stop on their own (while starting, or
    after their last step): that is the stop asked for, raised as ``TrainingInterrupted``.
    ``ctrl_c_notice`` (said at the first Ctrl-C) and ``ended`` (the stop's message, after
    the signal and the workers) say what a stop does to the workers' work: training's unless
    given (the workers of a pair screen end at once, keeping the chunks they wrote).
    """
    workers = SpawnedWorkers(worker, worker_args, nprocs)
    try:
        with signals_passed_on(STOP_SIGNALS, workers.processes, ctrl_c_notice) as received:
            while not workers.finished():
                multiprocessing.connection.wait(workers.sentinels(), timeout=poll_s)
        try:
            return workers.result()
        except DistributedTrainingError:
            stop = workers.ended_by(received)
            if stop is None:
                raise
            raise TrainingInterrupted(
                f"stopped by {described_signal(stop)}, passed on to the {nprocs} worker process(es), {ended}",
                signal_name(stop),
                None,
            ) from None
    finally:
        workers.close()


class SpawnedWorkers:
    """``nprocs`` processes running ``worker(local_rank, *worker_args, messages)``, started
    with ``mp.spawn`` and watched without blocking, so that one parent can watch several
    sets at once (``train_replicates``).

    The messages are read while the workers run (a worker writing more than a pipe holds
    would otherwise wait forever for a parent that waits for it), and reading never waits
    for a message a dead worker left half-written. Log records go to this process's loggers
    as they arrive, their messages prefixed with ``log_prefix``. Where several
    processes share the machine's cores (``ranks_on_machine``: the ``nprocs`` workers, or
    with other sets beside them, all of them), the workers' OpenMP threads wait passively
    unless the user chose otherwise (``threads.passive_openmp_environment``); a process
    alone on the machine keeps OpenMP's default, as training in the calling process does.

    The workers ignore Ctrl-C (SIGINT): a terminal sends it to the parent too, which passes it
    on (``signals_passed_on``), so that one press is one stop. They are started with Ctrl-C
    and the stop signals deferred (``_stops_deferred``), so that one that lands while they
    start cannot end the parent halfway through writing their arguments, nor them before they
    read them; the parent reads it once they are started.

    When a worker fails, the others get ``SHUTDOWN_GRACE_S`` to stop on their own (a peer's
    loss usually stops them at once), then SIGTERM, then SIGKILL: a lost rank ends the set
    within a bounded time and leaves no process behind. The error names the rank that failed
    first: one killed by a signal before it could report anything, else the one whose
    reported failure (a ``WorkerFailed`` message) came first.
    """

    def __init__(
        self, worker, worker_args: tuple, nprocs: int, log_prefix: str = "", ranks_on_machine: int | None = None
    ):
        self.nprocs, self.log_prefix = nprocs, log_prefix
        sharing_cores = (nprocs if ranks_on_machine is None else ranks_on_machine) > 1
        self.messages = WorkerMessages(mp.get_context("spawn"))
        self.received: list = []
        self.failed: list[tuple[int, int]] = []  # (rank, exit code) of the workers failed when a failure was seen
        started: list = []
        try:
            # Ctrl-C and the stop signals deferred while the workers start (the workers hold them
            # until they have read their arguments): what one raises as the block ends
            # (``Stopped``, ``KeyboardInterrupt``) ends the workers just started
            with passive_openmp_environment() if sharing_cores else contextlib.nullcontext(), _stops_deferred():
                self.context = mp.spawn(
                    functools.partial(_ending_with_parent, worker, os.getpid()),
                    args=(*worker_args, self.messages),
                    nprocs=nprocs,
                    join=False,
                )
                started = self.context.processes
        except BaseException:
            _end_processes(started)
            self.messages.close()
            raise
        self.processes = self.context.processes
        self.holding = contextlib.ExitStack()  # what the set holds while it runs (a run folder), released by close

    def collect(self) -> list:
        """Every message but the log records received so far (those are handed on)."""
        for message in self.messages.receive():
            if isinstance(message, LogRecord):
                replay_log(message.fields, self.log_prefix)
            else:
                self.received.append(message)
        return self.received

    def sentinels(self) -> list:
        """What ``multiprocessing.connection.wait`` waits on: the workers still running."""
        return [process.sentinel for process in self.processes if process.exitcode is None]

    def finished(self) -> bool:
        """Whether every worker exited or one failed (remembered in ``failed``)."""
        self.collect()
        # one reading of the exit codes: a worker that exits between two readings would
        # count as neither failed nor running, and its failure would go unseen
        exit_codes = [process.exitcode for process in self.processes]
        self.failed = [(rank, code) for rank, code in enumerate(exit_codes) if code not in (None, 0)]
        return bool(self.failed) or None not in exit_codes

    def result(self) -> list:
        """Once ``finished``: the workers' messages, or, when one failed, the others stopped
        and a :class:`DistributedTrainingError` naming the first failure."""
        if not self.failed:
            return self.collect()
        _stop_workers(self.processes, self.collect)
        errors = sorted(m for m in self.collect() if isinstance(m, WorkerFailed))
        raise _failure(
            self.failed, errors, self.nprocs, _raised_before_reporting(self.context.error_files[self.failed[0][0]])
        )

    def send(self, number: int) -> None:
        """Send the signal ``number`` to every worker still running."""
        _signal_processes(self.processes, number)

    def ended_by(self, received: list[int]) -> int | None:
        """Once ``finished``: the signal among ``received`` (those passed on to the workers,
        as ``passed_on_as`` sends them) that ended every failed worker, or None when one
        failed otherwise."""
        codes = {code for _, code in self.failed}
        sent = {passed_on_as(number): number for number in received}
        ending = {sent.get(-code) for code in codes}
        if not codes or None in ending:
            return None
        return ending.pop() if len(ending) == 1 else received[0]

    def close(self) -> None:
        """End any worker still running (whatever happened, none outlives its set), close the
        channel, release what the set held (``holding``) and delete the files ``mp.spawn`` made for the workers'
        tracebacks (a failed
        worker's stays in the temporary folder otherwise: torch deletes it only in its own
        ``join``, which this class does not call). Ctrl-C and the stop signals are deferred
        meanwhile (``_stops_deferred``): one raised halfway would leave workers running."""
        with _stops_deferred():
            _end_processes(self.processes)
            self.messages.close()
            for error_file in self.context.error_files:
                Path(error_file).unlink(missing_ok=True)
            self.holding.close()


def _signal_processes(processes, number: int) -> None:
    """Send the signal ``number`` to those of ``processes`` still running."""
    for process in processes:
        if process.is_alive():
            os.kill(process.pid, number)


def _end_processes(processes) -> None:
    """Kill those of ``processes`` still running, and wait for each to end."""
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join()


def _ending_with_parent(worker, parent_pid: int, local_rank: int, *args) -> None:
    """Run ``worker(local_rank, *args)`` in a process that ends (SIGKILL) when the thread
    that spawned it ends, however it ends (Linux's ``PR_SET_PDEATHSIG``): a parent killed
    with SIGKILL releases the run folder it held, and its ranks must not go on writing there
    beside the next run. Elsewhere the worker runs as it is. Ctrl-C and the stop signals,
    blocked since the worker started (``_stops_deferred``), are let in here: Ctrl-C ignored
    (the parent passes it on), a stop signal as the worker handles it (one that came
    meanwhile ends a worker that handles none, as it would have at once)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent ended before the setting took effect
            os._exit(1)
    signal.signal(CTRL_C, signal.SIG_IGN)  # one held meanwhile is dropped with it
    if hasattr(signal, "pthread_sigmask"):  # POSIX
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {CTRL_C, *STOP_SIGNALS})
    try:
        worker(local_rank, *args)
    finally:  # the process ends when the worker returns or raises
        heap_frozen_for_exit()


@contextlib.contextmanager
def _stops_deferred():
    """Run the block whole: Ctrl-C and the stop signals that come while it runs are kept and
    delivered, in the order they came, when it ends, to the handlers there were before.

    A stop that landed while ``mp.spawn`` wrote a worker's arguments ended this process
    halfway (``Stopped``, ``KeyboardInterrupt``) and left the worker reading half of them
    ("pickle data was truncated", a traceback per worker); one that landed while ``close``
    ended the workers left some running. Python runs signal handlers in the main thread
    (elsewhere the block just runs), so the handlers are swapped for one that keeps the
    signal; blocking them would not do, as the kernel hands a signal that this thread blocks
    to another thread. They are blocked here too, for the processes started meanwhile, which
    inherit this thread's mask: a signal sent to the whole process group cannot end a worker
    before it has read its arguments (``_ending_with_parent`` lets them in). Where signals
    cannot be blocked (Windows), only the handlers are swapped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers, came = (CTRL_C, *STOP_SIGNALS), []
    previous = {number: signal.signal(number, lambda number, frame: came.append(number)) for number in numbers}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, numbers) if hasattr(signal, "pthread_sigmask") else None
    try:
        yield
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one pending for this thread is kept now
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        for number in dict.fromkeys(came):
            signal.raise_signal(number)


def _stop_workers(processes, collect) -> None:
    """Give the remaining workers a grace period to stop, then SIGTERM, then SIGKILL."""
    for ending in (None, "terminate", "kill"):
        for process in processes:
            if ending and process.is_alive():
                getattr(process, ending)()
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
            collect()
            multiprocessing.connection.wait([p.sentinel for p in processes if p.is_alive()], timeout=0.1)
        if not any(p.is_alive() for p in processes):
            return


def _raised_before_reporting(error_file: str) -> str | None:
    """The traceback ``mp.spawn`` kept of an exception raised outside the worker's own
    reporting (for instance while its arguments were unpickled), if there is one."""
    try:
        return loads_plain_data(Path(error_file).read_bytes())
    except (OSError, ValueError, pickle.UnpicklingError, EOFError):
        return None


def _failure(
    failed: list[tuple[int, int]], errors: list[WorkerFailed], nprocs: int, raised: str | None = None
) -> DistributedTrainingError:
    """The error that tells the user which rank failed first, and why."""
    reported = {m.worker: m.traceback for m in errors}
    killed = [(rank, code) for rank, code in failed if code < 0 and rank not in reported]  # could not say why
    if killed:
        rank, code = killed[0]
        others = sorted(r for r in reported if r != rank)
        killed_by = f"rank {rank} of {nprocs} was killed by {signal.Signals(-code).name}"
        if not others:
            return DistributedTrainingError(f"{killed_by} (out of memory, or stopped from outside?)")
        return DistributedTrainingError(  # the last line names the cause again, below the other rank's traceback
            f"{killed_by} (out of memory, or stopped from outside?); ranks {others} failed after it, the first "
            f"with:\n{reported[others[0]].rstrip()}\n(the cause: {killed_by})"
        )
    if errors:
        rank, trace = errors[0].worker, errors[0].traceback
        later = sorted({m.worker for m in errors[1:]})
        return DistributedTrainingError(
            f"rank {rank} of {nprocs} failed first; its traceback:\n{trace}"
            + (f"\nranks {later} failed after rank {rank}" if later else "")
        )
    rank, code = failed[0]
    if raised:
        return DistributedTrainingError(f"rank {rank} of {nprocs} failed; its traceback:\n{raised}")
    return DistributedTrainingError(
        f"rank {rank} of {nprocs} exited with code {code} before it started training: when a script calls "
        "train_multi_gpu, each worker process first imports that script, so the call must sit under "
        '`if __name__ == "__main__":` (see the worker\'s error above)'
    )


@contextlib.contextmanager
def signals_passed_on(numbers, processes, ctrl_c_notice: str = CTRL_C_NOTICE):
    """While active (in the main thread), pass the signals ``numbers`` and Ctrl-C on to
    ``processes`` (a list, read when a signal arrives: processes added to it later receive
    them too), each as ``passed_on_as`` says. Yields the list of the signal numbers received
    so far.

    Ctrl-C is always among them: the workers of ``SpawnedWorkers`` ignore it, whether it
    reaches them from a terminal (which sends it to the whole process group) or not (a
    notebook's interrupt reaches the parent only). The first is passed on and announced
    (``ctrl_c_notice``); a second raises ``KeyboardInterrupt`` here: the caller ends the
    workers on its way out."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def pass_on(number, frame):
        if number == CTRL_C:
            if CTRL_C in received:
                raise KeyboardInterrupt
            announce_ctrl_c(ctrl_c_notice)
        received.append(number)
        _signal_processes(processes, passed_on_as(number))

    previous = {number: signal.signal(number, pass_on) for number in (CTRL_C, *numbers)}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
