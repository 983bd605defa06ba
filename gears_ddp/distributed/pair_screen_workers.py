"""In-silico pair screens on several devices of one machine: the chunks of a pair screen's
pairs shared among spawned workers, one per GPU or one single-thread process per CPU core.

The parent builds the screen's job once (the genes checked, the Theil-Sen subsets drawn)
and hands each worker the same job and its own chunks, every ``workers``-th of those left
to compute. Pairs are independent, so the workers never talk to each other: each writes
its finished chunks (or, without an output file, sends them to the parent), and the parent
merges them into one table in pair order (``inference.pair_screen_job.run_pair_screen``).
Chunk layout and forward passes do not depend on the number of workers, so the table does
not either. A pair screen over replicates (``replicate_pair_screen_on_devices``; its models are
loaded by ``runs.pair_screens``) screens one model after the other, each shared among the
workers the same way.

On CPU one thread per process: the scores are many small operations, and on a busy
machine threads that wait for each other lose far more than they gain (measured in
benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import pandas as pd
import torch

from gears_ddp._logging import get_logger
from gears_ddp._options import signature_with
from gears_ddp.inference.pair_screen_job import (
    PairScreenFolder,
    PairScreenJob,
    run_pair_screen,
    score_chunks,
    score_chunks_here,
)
from gears_ddp.inference.pair_screen_options import PairScreenOptions
from gears_ddp.inference.replicate_pair_screen import run_replicate_pair_screen
from gears_ddp.launching.main_guard import check_main_guard
from gears_ddp.launching.supervisor import spawn_workers
from gears_ddp.launching.worker_messages import PairScreenChunk
from gears_ddp.runtime.devices import cuda_or_cpu, located_devices, visible_cuda_devices
from gears_ddp.runtime.threads import at_most_usable_threads, cpu_threads, usable_cores

logger = get_logger(__name__)

# what a stop does to a screen: its workers end at once (SIGTERM, or Ctrl-C passed on); the chunks
# they finished are in the screen's folder beside its table, where a run of the same screen finds them
SCREEN_CTRL_C_NOTICE = (
    "Ctrl-C: the pair screen stops now; the chunks its workers finished are kept beside its table, and "
    "the same screen continues from them"
)
SCREEN_ENDED = (
    "which ended them: the chunks they finished are kept beside the screen's table, and the same screen "
    "continues from them"
)


def pair_screen_devices(options: PairScreenOptions) -> list[torch.device]:
    """The device of each worker of ``options`` (their request checked before):
    ``cpu_processes`` CPU processes when given; else the GPUs ``gpu_ids`` (every visible one
    when None); without GPUs, one CPU process per usable core.

    GPUs asked for on a machine without CUDA are refused here, in the screen's words (its
    options, on the command line and in Python), not in those of ``located_devices``, which
    speak of training."""
    if options.gpu_ids is not None and not visible_cuda_devices():
        raise ValueError(
            f"--gpu-ids / gpu_ids={options.gpu_ids} asks for GPUs, but torch sees no CUDA GPU here "
            f"(torch.cuda.is_available() is {torch.cuda.is_available()}; torch {torch.__version__}): to screen on "
            "the CPU, leave out the GPUs (one process per usable core), or pass --cpu-processes N "
            "(cpu_processes=N to pair_screen_on_devices or pair_screen_replicates) for N processes"
        )
    cpu_processes = options.cpu_processes
    if cpu_processes is None and options.gpu_ids is None and cuda_or_cpu().type == "cpu":
        cpu_processes = usable_cores()
    return located_devices(None, options.gpu_ids, cpu_processes)


def pair_screen_on_devices(gears, genes, **options) -> pd.DataFrame:
    """``GEARS.screen`` with the pairs shared among workers on ``pair_screen_devices``; the
    same table, the same resumable output. ``options``: ``PairScreenOptions`` (one seed).
    One device runs in this process; several are spawned processes, so a script calling
    this needs ``if __name__ == "__main__":``."""
    checked = PairScreenOptions.from_dict(options, "pair_screen_on_devices").with_one_draw("pair_screen_on_devices")
    return pair_screen_checked(gears, genes, checked)


pair_screen_on_devices.__signature__ = signature_with(pair_screen_on_devices, PairScreenOptions)  # type: ignore[attr-defined]


def pair_screen_checked(gears, genes, options: PairScreenOptions) -> pd.DataFrame:
    """``pair_screen_on_devices`` of options checked before (``gears-ddp screen``)."""
    devices = pair_screen_devices(options)
    job = gears.pair_screen_job(genes, options)
    return run_pair_screen(job, options.out, options.overwrite, _executor(devices, "pair_screen_on_devices"))


def replicate_pair_screen_on_devices(
    jobs: Mapping[str, Sequence[PairScreenJob]], devices: list[torch.device], out=None, overwrite: bool = False
) -> pd.DataFrame:
    """A pair screen over replicates (``inference.replicate_pair_screen``) of the models'
    ``jobs``, each model's pairs shared among the workers on ``devices``
    (``pair_screen_devices``, found before the models were loaded) as ``pair_screen_on_devices``
    shares them (``runs.pair_screens.pair_screen_replicates`` loads the models)."""
    return run_replicate_pair_screen(jobs, out, overwrite, _executor(devices, "pair_screen_replicates"))


def _executor(devices: list[torch.device], caller: str):
    """An executor for ``run_pair_screen`` on ``devices``: this process for one device, spawned
    workers for several (which need ``caller``'s script to be guarded)."""
    if len(devices) > 1:
        check_main_guard(caller)
        return _spawning_executor(devices)

    def execute(job, chunks, folder):
        with at_most_usable_threads():
            return score_chunks_here(job, chunks, folder, devices[0])

    return execute


def _spawning_executor(devices: list[torch.device]):
    """An executor for ``run_pair_screen`` that shares the chunks among workers on ``devices``."""

    def execute(job: PairScreenJob, chunks: list[int], folder: PairScreenFolder | None) -> dict[int, dict]:
        if not chunks:
            return {}
        workers = min(len(devices), len(chunks))
        shared = dataclasses.replace(job, predictor=job.predictor.to("cpu"))  # each worker moves it to its device
        shares = [chunks[worker::workers] for worker in range(workers)]
        logger.info("pair screen: %d chunks shared among %d %s worker(s)", len(chunks), workers, devices[0].type)
        messages = spawn_workers(
            pair_screen_worker,
            (shared, shares, devices[:workers], folder),
            workers,
            ctrl_c_notice=SCREEN_CTRL_C_NOTICE,
            ended=SCREEN_ENDED,
        )
        return {message.chunk: message.scores for message in messages if isinstance(message, PairScreenChunk)}

    return execute


def pair_screen_worker(
    worker: int,
    job: PairScreenJob,
    shares: list[list[int]],
    devices: list[torch.device],
    folder: PairScreenFolder | None,
    messages,
) -> None:
    """The ``torch.multiprocessing.spawn`` target: score the chunks ``shares[worker]`` on
    ``devices[worker]``, writing each to ``folder`` (else putting a ``PairScreenChunk`` on
    ``messages``); a failure is put there (``WorkerFailed``) before it is raised."""
    messages.forward_logs(worker)
    try:
        device = devices[worker]
        if device.type == "cpu":
            torch.set_num_threads(cpu_threads(len(devices)))
        else:
            torch.cuda.set_device(device)
        store = (
            folder.write_chunk
            if folder is not None
            else (lambda chunk, scores: messages.put(PairScreenChunk(chunk, scores)))
        )
        score_chunks(job, shares[worker], store, device, label=f"pair screen worker {worker}")
    except BaseException:
        messages.put_failure(worker)
        raise
