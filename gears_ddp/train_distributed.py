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
from pathlib import Path

import torch.multiprocessing as mp

from gears_ddp._logging import get_logger
from gears_ddp.data import download
from gears_ddp.data.pertdata import PertData
from gears_ddp.distributed.config import MODEL_DEFAULTS, SplitConfig, TrainingArgs
from gears_ddp.distributed.messages import WorkerMessages, replay_log
from gears_ddp.distributed.runtime import cleanup_ddp, find_free_port, resolve_devices, setup_ddp
from gears_ddp.distributed.worker import Placement, spawned_worker, train_ddp_worker
from gears_ddp.engine import Precision
from gears_ddp.options import check_save_path

__all__ = ["train_multi_gpu", "setup_ddp", "cleanup_ddp", "train_ddp_worker", "DistributedTrainingError"]

logger = get_logger(__name__)


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
    if options.save_path is not None:
        check_save_path(options.save_path)
    pert_data = prepare_data(pert_data_path, dataset_name, split, options).share_memory_()
    port = int(os.environ.get("MASTER_PORT") or find_free_port())
    placements = [Placement(rank, len(devices), rank, len(devices), device, "127.0.0.1", port)
                  for rank, device in enumerate(devices)]
    logger.info("starting %d %s process(es): %s", len(devices), devices[0].type, [str(d) for d in devices])
    messages = spawn_workers(spawned_worker, (placements, pert_data, options), len(devices))
    return next(message[1] for message in messages if message[0] == "report")


def spawn_workers(worker, worker_args: tuple, nprocs: int, poll_s: float = 0.2) -> list:
    """``mp.spawn`` ``worker(local_rank, *worker_args, messages)`` and return what the workers
    ``messages.put`` (a :class:`WorkerMessages`), except their log records, which go to this
    process's loggers as they arrive.

    The messages are read while the workers run (a worker writing more than a pipe holds
    would otherwise wait forever for a parent that waits for it), and reading never waits
    for a message a dead worker left half-written. A worker's failure becomes one error
    naming its rank, with its traceback (``mp.spawn`` stops the other workers): when workers
    report failures as ``("error", time, rank, traceback)``, the rank that failed first,
    since the others usually failed because it went away.
    """
    messages = WorkerMessages(mp.get_context("spawn"))
    received = []

    def collect() -> list:
        for message in messages.receive():
            if message[0] == "log":
                replay_log(message[1])
            else:
                received.append(message)
        return received

    try:
        context = mp.spawn(worker, args=(*worker_args, messages), nprocs=nprocs, join=False)
        while not context.join(timeout=poll_s):
            collect()
        return collect()
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
        errors = sorted(m for m in collect() if m[0] == "error")
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
