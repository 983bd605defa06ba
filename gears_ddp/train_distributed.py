"""``train_multi_gpu``: train GEARS on several devices of one machine with DDP.

The parent process validates the options, checks the devices and the save folder, loads
the data once, prepares the split and the graphs, moves the expression to shared memory
and starts one worker per device with ``torch.multiprocessing.spawn``; it does not train.
A worker that fails stops the others, and the parent raises an error with that rank's
traceback. Runs across several machines use ``python -m gears_ddp.launch`` under torchrun
or Slurm (same worker, same options).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch.multiprocessing as mp

from gears_ddp._logging import get_logger
from gears_ddp.data import download
from gears_ddp.data.pertdata import PertData
from gears_ddp.distributed.config import MODEL_DEFAULTS, SplitConfig, TrainingArgs
from gears_ddp.distributed.messages import WorkerMessages
from gears_ddp.distributed.runtime import cleanup_ddp, find_free_port, resolve_devices, setup_ddp
from gears_ddp.distributed.worker import train_ddp_worker
from gears_ddp.engine import Precision

__all__ = ["train_multi_gpu", "setup_ddp", "cleanup_ddp", "train_ddp_worker", "DistributedTrainingError"]

logger = get_logger(__name__)
MIN_FREE_BYTES = 50 * 2**20


class DistributedTrainingError(RuntimeError):
    """A worker process failed; the message holds its rank and traceback."""


def load_dataset(pert_data_path, dataset_name: str) -> PertData:
    """A published dataset by name (downloaded if absent) or ``pert_data_path/dataset_name``."""
    pert_data = PertData(pert_data_path)
    if dataset_name in download.DATASET_FILE_IDS:
        pert_data.load(data_name=dataset_name)
    else:
        pert_data.load(data_path=Path(pert_data_path) / dataset_name)
    return pert_data


def check_save_path(save_path) -> Path:
    """Create the save folder and make sure it is writable with room for checkpoints,
    before any process starts (a full disk must not surface after hours of training)."""
    path = Path(save_path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".gears_ddp_write_test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as err:
        raise PermissionError(f"cannot write to save_path {path}: {err}") from err
    free = shutil.disk_usage(path).free
    if free < MIN_FREE_BYTES:
        raise OSError(f"save_path {path} has only {free / 2**20:.0f} MiB free; checkpoints need at least "
                      f"{MIN_FREE_BYTES / 2**20:.0f} MiB")
    return path


def prepare_data(pert_data_path, dataset_name: str, split: SplitConfig, args: TrainingArgs) -> PertData:
    """Load the data, prepare the split and build (cache) the graphs, once, for all workers."""
    pert_data = load_dataset(pert_data_path, dataset_name)
    pert_data.prepare_split(**split.options)
    options = {**MODEL_DEFAULTS, **args.model_config}  # the graphs model_initialize will ask for
    pert_data.coexpression_graph(options["coexpress_threshold"], options["num_similar_genes_co_express_graph"])
    pert_data.go_graph(options["num_similar_genes_go_graph"])
    return pert_data


def train_multi_gpu(pert_data_path, dataset_name: str, split_config: dict, args: dict, n_gpus: int | None = None,
                    gpu_ids=None) -> dict:
    """Train GEARS with one process per device and return rank 0's report: test metrics of
    the model and the baselines (``'model'``, ``'baselines'``), ``'model_path'``,
    ``'best_epoch'`` and the per-epoch ``'history'``.

    ``gpu_ids`` picks CUDA devices (rank r uses ``gpu_ids[r]``); ``n_gpus=None`` uses every
    visible GPU; ``args['cpu_processes'] = N`` runs N CPU processes with gloo instead.
    """
    split = SplitConfig.from_dict(split_config)
    options = TrainingArgs.from_dict(args)
    devices = resolve_devices(n_gpus, gpu_ids, options.cpu_processes)
    Precision.for_mode(options.amp, devices[0])  # an impossible precision fails before any process starts
    check_save_path(options.save_path)
    pert_data = prepare_data(pert_data_path, dataset_name, split, options).share_memory_()
    port = int(os.environ.get("MASTER_PORT") or find_free_port())
    world_size = len(devices)
    logger.info("training on %d %s process(es): %s", world_size, devices[0].type, [str(d) for d in devices])
    messages = spawn_workers(train_ddp_worker, (world_size, pert_data, options, devices, "127.0.0.1", port),
                             world_size)
    return next(message[1] for message in messages if message[0] == "report")


def spawn_workers(worker, worker_args: tuple, nprocs: int, poll_s: float = 0.2) -> list:
    """``mp.spawn`` ``worker(local_rank, *worker_args, messages)`` and return what the workers
    ``messages.put`` (a :class:`WorkerMessages`).

    The messages are read while the workers run (a worker writing more than a pipe holds
    would otherwise wait forever for a parent that waits for it), and reading never waits
    for a message a dead worker left half-written. A worker's failure becomes one error
    naming its rank, with its traceback (``mp.spawn`` stops the other workers): when workers
    report failures as ``("error", time, rank, traceback)``, the rank that failed first,
    since the others usually failed because it went away.
    """
    messages = WorkerMessages(mp.get_context("spawn"))
    received = []
    try:
        context = mp.spawn(worker, args=(*worker_args, messages), nprocs=nprocs, join=False)
        while not context.join(timeout=poll_s):
            received += messages.receive()
        return received + messages.receive()
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
        errors = sorted(m for m in received + messages.receive() if m[0] == "error")
        if errors:
            _, _, rank, trace = errors[0]
            later = sorted({m[2] for m in errors[1:]})
            raise DistributedTrainingError(f"rank {rank} of {nprocs} failed first; its traceback:\n{trace}"
                                           + (f"\nranks {later} failed after it" if later else "")) from None
        if isinstance(err, mp.ProcessRaisedException):
            raise DistributedTrainingError(f"rank {err.error_index} of {nprocs} failed; its traceback:\n{err.msg}") \
                from None
        raise DistributedTrainingError(f"rank {err.error_index} of {nprocs} exited with code {err.exit_code} "
                                       "(killed, or out of memory?)") from None
    finally:
        messages.close()
