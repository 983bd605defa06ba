"""``train_multi_gpu``: train GEARS on several devices of one machine with DDP.

The parent process validates the options, checks the devices and the save folder, loads
the data once, prepares the split and the graphs, moves the expression to shared memory
and starts one worker per device with ``torch.multiprocessing.spawn``; it does not train.
A worker that fails stops the others, and the parent raises an error with that rank's
traceback. Runs across several machines use ``python -m gears_ddp.launch`` under torchrun
or Slurm (same worker, same options).
"""
from __future__ import annotations

import ast
import contextlib
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

from gears_ddp._logging import get_logger
from gears_ddp.data import download
from gears_ddp.data.io import file_lock, loads_plain_data
from gears_ddp.data.pertdata import PertData
from gears_ddp.distributed.config import SplitConfig, TrainingArgs
from gears_ddp.distributed.messages import WorkerMessages, replay_log
from gears_ddp.distributed.runtime import cleanup_ddp, find_free_port, resolve_devices, setup_ddp
from gears_ddp.distributed.worker import Placement, spawned_worker, train_ddp_worker
from gears_ddp.training.engine import Precision
from gears_ddp.training.options import check_save_path
from gears_ddp.distributed.run_config import resolved_config, write_run_config
from gears_ddp.runtime.stopping import STOP_SIGNALS, TrainingInterrupted
from gears_ddp.runtime.threads import passive_openmp_environment
from gears_ddp.training.checkpoint import resolve_resume

__all__ = ["train_multi_gpu", "setup_ddp", "cleanup_ddp", "train_ddp_worker", "DistributedTrainingError"]

logger = get_logger(__name__)
SHUTDOWN_GRACE_S = 5.0  # after a rank fails, how long the others get to stop before they are ended


class DistributedTrainingError(RuntimeError):
    """A worker process failed; the message holds its rank and traceback."""


def load_dataset(pert_data_path, dataset_name: str, expression_storage: str = "mapped",
                 expression_dtype: str = "float32") -> PertData:
    """A published dataset by name (downloaded if absent) or ``pert_data_path/dataset_name``."""
    pert_data = PertData(pert_data_path, expression_storage=expression_storage, expression_dtype=expression_dtype)
    if dataset_name in download.DATASET_FILE_IDS:
        pert_data.load(data_name=dataset_name)
    else:
        pert_data.load(data_path=Path(pert_data_path) / dataset_name)
    return pert_data


def prepare_data(pert_data_path, dataset_name: str, split: SplitConfig, args: TrainingArgs) -> PertData:
    """Load the data, prepare the split and build (cache) the graphs, once, for all workers.

    Processes that prepare the same dataset at the same moment (the torchrun or srun ranks
    of one machine, or jobs sharing a data folder) take turns on a lock file beside the
    dataset: the first downloads, maps and builds what is missing, the others find it built
    and only read it, so a fresh folder costs one build per machine, not one per rank.
    """
    dataset = Path(pert_data_path) / dataset_name
    with file_lock(dataset.parent / f".{dataset.name}.prepare.lock"):
        pert_data = load_dataset(pert_data_path, dataset_name, args.expression_storage, args.expression_dtype)
        pert_data.prepare_split(**split.options)
        options = args.model_config  # the graphs model_initialize will ask for
        pert_data.coexpression_graph(options["coexpress_threshold"], options["num_similar_genes_co_express_graph"])
        pert_data.go_graph(options["num_similar_genes_go_graph"])
    pert_data.cells.identity()  # values in memory are hashed here, once, not in every spawned worker
    return pert_data


def train_multi_gpu(pert_data_path, dataset_name: str, split_config: dict, args: dict, n_gpus: int | None = None,
                    gpu_ids=None) -> dict:
    """Train GEARS with one process per device and return rank 0's report: test metrics of
    the model and the baselines (``'model'``, ``'baselines'``), ``'model_path'``,
    ``'best_epoch'`` and the per-epoch ``'history'``.

    ``gpu_ids`` picks CUDA devices (rank r uses ``gpu_ids[r]``); ``n_gpus=None`` uses every
    visible GPU; ``args['cpu_processes'] = N`` runs N CPU processes with gloo instead.
    """
    check_main_guard("train_multi_gpu")
    split = SplitConfig.from_dict(split_config)
    options = TrainingArgs.from_dict(args)
    devices = resolve_devices(n_gpus, gpu_ids, options.cpu_processes)
    Precision.for_mode(options.amp, devices[0])  # an impossible precision fails before any process starts
    if options.resume_from not in (None, "auto"):
        resolve_resume(options.resume_from, options.save_path)  # an unreadable checkpoint fails before any worker
    if options.save_path is not None:
        check_save_path(options.save_path)
        write_run_config(options.save_path, resolved_config(str(pert_data_path), dataset_name, split, options,
                                                            n_gpus, gpu_ids))
    pert_data = prepare_data(pert_data_path, dataset_name, split, options).share_memory_()
    port = int(os.environ.get("MASTER_PORT") or find_free_port())
    placements = [Placement(rank, len(devices), rank, len(devices), device, "127.0.0.1", port)
                  for rank, device in enumerate(devices)]
    logger.info("starting %d %s process(es): %s", len(devices), devices[0].type, [str(d) for d in devices])
    messages = spawn_workers(spawned_worker, (placements, pert_data, options), len(devices))
    for message in messages:
        if message[0] == "interrupted":
            raise TrainingInterrupted(*message[1:])
    return next(message[1] for message in messages if message[0] == "report")


_IMPORTED_AT = time.time()  # a main script whose file is newer was edited while it ran


def check_main_guard(caller: str) -> None:
    """Refuse to start workers from a script whose call is not under ``if __name__ ==
    "__main__":``. Each spawned worker imports the main script first, so without the guard
    every worker would run the script, and the call, again."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        where = "the script, which a starting worker process is importing"
    else:
        where = _unguarded_call_site()
        if where is None:
            return
    raise RuntimeError(f"{caller} is called at the top level of {where}, outside `if __name__ == \"__main__\":`. "
                       "The worker processes it starts import the script first, so they would call it again: "
                       "put the call (or the main() that makes it) under that guard")


def _unguarded_call_site() -> str | None:
    """``'file, line N'`` where the main script's top level leads to this call outside an
    ``if __name__ == "__main__":`` block; None when guarded or when the source is unknown
    (an interactive session, ``python -c``, a script edited since it started)."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>"
                                     and frame.f_globals.get("__name__") == "__main__"):
        frame = frame.f_back
    if frame is None:
        return None
    path, line = frame.f_code.co_filename, frame.f_lineno
    try:
        if Path(path).stat().st_mtime > _IMPORTED_AT:  # edited since it started: its lines may have moved
            return None
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.lineno <= line <= node.end_lineno \
                and ast.unparse(node.test).replace("'", '"') in ('__name__ == "__main__"', '"__main__" == __name__'):
            return None
    return f"{path}, line {line}"


def spawn_workers(worker, worker_args: tuple, nprocs: int, poll_s: float = 0.2) -> list:
    """``mp.spawn`` ``worker(local_rank, *worker_args, messages)`` and return what the workers
    ``messages.put`` (a :class:`WorkerMessages`), except their log records, which go to this
    process's loggers as they arrive.

    SIGTERM and SIGUSR1 sent to this process while the workers run are passed on to them (a
    scheduler's warning reaches every rank). A failed worker raises the
    :class:`DistributedTrainingError` of :meth:`SpawnedWorkers.result`.
    """
    workers = SpawnedWorkers(worker, worker_args, nprocs)
    try:
        with signals_passed_on(STOP_SIGNALS, workers.processes):
            while not workers.finished():
                multiprocessing.connection.wait(workers.sentinels(), timeout=poll_s)
        return workers.result()
    finally:
        workers.close()


class SpawnedWorkers:
    """``nprocs`` processes running ``worker(local_rank, *worker_args, messages)``, started
    with ``mp.spawn`` and watched without blocking, so that one parent can watch several
    sets at once (``train_replicates``).

    The messages are read while the workers run (a worker writing more than a pipe holds
    would otherwise wait forever for a parent that waits for it), and reading never waits
    for a message a dead worker left half-written. Log records go to this process's loggers
    as they arrive, their messages prefixed with ``log_prefix``. The workers' OpenMP threads
    wait passively unless the user chose otherwise (``threads.passive_openmp_environment``).

    When a worker fails, the others get ``SHUTDOWN_GRACE_S`` to stop on their own (a peer's
    loss usually stops them at once), then SIGTERM, then SIGKILL: a lost rank ends the set
    within a bounded time and leaves no process behind. The error names the rank that failed
    first: one killed by a signal before it could report anything, else the one whose
    reported failure (``("error", time, rank, traceback)``) came first.
    """

    def __init__(self, worker, worker_args: tuple, nprocs: int, log_prefix: str = ""):
        self.nprocs, self.log_prefix = nprocs, log_prefix
        self.messages = WorkerMessages(mp.get_context("spawn"))
        self.received: list = []
        self.failed: list[tuple[int, int]] = []  # (rank, exit code) of the workers failed when a failure was seen
        try:
            with passive_openmp_environment():
                self.context = mp.spawn(worker, args=(*worker_args, self.messages), nprocs=nprocs, join=False)
        except BaseException:
            self.messages.close()
            raise
        self.processes = self.context.processes

    def collect(self) -> list:
        """Every message but the log records received so far (those are handed on)."""
        for message in self.messages.receive():
            if message[0] == "log":
                replay_log(message[1], self.log_prefix)
            else:
                self.received.append(message)
        return self.received

    def sentinels(self) -> list:
        """What ``multiprocessing.connection.wait`` waits on: the workers still running."""
        return [process.sentinel for process in self.processes if process.exitcode is None]

    def finished(self) -> bool:
        """Whether every worker exited or one failed (remembered in ``failed``)."""
        self.collect()
        self.failed = [(rank, p.exitcode) for rank, p in enumerate(self.processes) if p.exitcode not in (None, 0)]
        return bool(self.failed) or not self.sentinels()

    def result(self) -> list:
        """Once ``finished``: the workers' messages, or, when one failed, the others stopped
        and a :class:`DistributedTrainingError` naming the first failure."""
        if not self.failed:
            return self.collect()
        _stop_workers(self.processes, self.collect)
        errors = sorted(m for m in self.collect() if m[0] == "error")
        raise _failure(self.failed, errors, self.nprocs,
                       _raised_before_reporting(self.context.error_files[self.failed[0][0]]))

    def close(self) -> None:
        """End any worker still running (whatever happened, none outlives its set) and close
        the channel."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join()
        self.messages.close()


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


def _failure(failed: list[tuple[int, int]], errors: list, nprocs: int,
             raised: str | None = None) -> DistributedTrainingError:
    """The error that tells the user which rank failed first, and why."""
    reported = {m[2]: m[3] for m in errors}
    killed = [(rank, code) for rank, code in failed if code < 0 and rank not in reported]  # could not say why
    if killed:
        rank, code = killed[0]
        others = sorted(r for r in reported if r != rank)
        killed_by = f"rank {rank} of {nprocs} was killed by {signal.Signals(-code).name}"
        if not others:
            return DistributedTrainingError(f"{killed_by} (out of memory, or stopped from outside?)")
        return DistributedTrainingError(  # the last line names the cause again, below the other rank's traceback
            f"{killed_by} (out of memory, or stopped from outside?); ranks {others} failed after it, the first "
            f"with:\n{reported[others[0]].rstrip()}\n(the cause: {killed_by})")
    if errors:
        _, _, rank, trace = errors[0]
        later = sorted({m[2] for m in errors[1:]})
        return DistributedTrainingError(f"rank {rank} of {nprocs} failed first; its traceback:\n{trace}"
                                        + (f"\nranks {later} failed after rank {rank}" if later else ""))
    rank, code = failed[0]
    if raised:
        return DistributedTrainingError(f"rank {rank} of {nprocs} failed; its traceback:\n{raised}")
    return DistributedTrainingError(
        f"rank {rank} of {nprocs} exited with code {code} before it started training: when a script calls "
        "train_multi_gpu, each worker process first imports that script, so the call must sit under "
        "`if __name__ == \"__main__\":` (see the worker's error above)")


@contextlib.contextmanager
def signals_passed_on(numbers, processes):
    """While active (in the main thread), pass the signals ``numbers`` on to ``processes``
    (a list, read when a signal arrives: processes added to it later receive them too).
    Yields the list of the signal numbers received so far."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def pass_on(number, frame):
        received.append(number)
        for process in processes:
            if process.is_alive():
                os.kill(process.pid, number)

    previous = {number: signal.signal(number, pass_on) for number in numbers}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
