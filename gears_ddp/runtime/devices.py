"""The compute devices this machine has (CUDA GPUs, Apple silicon's GPU (MPS), the CPU), and
every check of a device request against them: one process's device (``checked_device``),
the form of a run's request (``check_device_request``, once, where its options are read),
the devices of spawned ranks (``located_devices``) and of a launched rank
(``launched_rank_device``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from gears_ddp._options import is_int


def mps_available() -> bool:
    """Whether torch can run on Apple silicon's GPU (Metal Performance Shaders)."""
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def best_device() -> torch.device:
    """What ``device='auto'`` picks: CUDA when torch sees a GPU, else MPS, else the CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.device("cuda")
    if mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def checked_device(device) -> torch.device:
    """``device`` as a torch device that this machine has (``'auto'``: ``best_device()``);
    otherwise a ValueError that says what there is."""
    if device == "auto":
        return best_device()
    try:
        checked = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device={device!r} is not a device: use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto' ({err})"
        ) from None
    if checked.type == "cuda":
        count = visible_cuda_devices()
        if count == 0:
            raise ValueError(
                f"device={device!r}, but torch sees no CUDA GPU (torch.cuda.is_available() is False; "
                f"torch {torch.__version__}): use device='cpu', or install a CUDA build of torch"
            )
        if (checked.index or 0) >= count:
            raise ValueError(f"device={device!r}, but torch sees {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")
    if checked.type == "mps" and not mps_available():
        raise ValueError(
            f"device={device!r}, but torch cannot use Apple silicon's GPU here "
            f"(torch.backends.mps.is_available() is False; torch {torch.__version__}): use "
            f"device='cpu' or 'auto'"
        )
    return checked


def visible_cuda_devices() -> int:
    """How many CUDA GPUs torch sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cuda_or_cpu() -> torch.device:
    """CUDA when torch sees a GPU, else the CPU: the device of work that runs on the GPUs or
    on CPU processes (a run's workers, a screen's), which Apple silicon's MPS does not."""
    return torch.device("cuda") if visible_cuda_devices() else torch.device("cpu")


def _counted_cuda_devices() -> int:
    """Number of CUDA devices this process can use, raising when there are none (with what
    to do instead on a Mac, whose one GPU, MPS, distributed training does not use)."""
    count = visible_cuda_devices()
    if count < 1 and mps_available():
        raise ValueError(
            "no CUDA device is visible; this machine's GPU is Apple silicon's (MPS), one device that "
            "distributed training does not run on (no NCCL, nothing to share the work with): train in one "
            "process with GEARS(pert_data, device='mps') (or device='auto') and gears.train(...), or pass "
            "cpu_processes=N (args['cpu_processes']) for N CPU processes with gloo"
        )
    if count < 1:
        raise ValueError(
            "no CUDA device is visible (torch.cuda.is_available() is False or no device is "
            "counted); to train without GPUs pass cpu_processes=N (args['cpu_processes']; gears-ddp "
            "train: --set args.cpu_processes=N) to run N CPU processes with the gloo backend instead"
        )
    return count


def check_device_request(n_gpus: int | None, gpu_ids: Sequence[int] | None, cpu_processes: int | None = None) -> None:
    """Check the form of a device request, before any device is looked at: the one check of
    ``n_gpus``, ``gpu_ids`` and ``cpu_processes``, made where a run's options are read.

    ``cpu_processes`` must be a count >= 1 given without GPU arguments; ``n_gpus`` a count
    >= 1 and ``gpu_ids`` a non-empty list of distinct integers of the same length.
    """
    if cpu_processes is not None:
        if n_gpus is not None or gpu_ids is not None:
            raise ValueError(
                f"cpu_processes={cpu_processes} cannot be combined with n_gpus={n_gpus} or "
                f"gpu_ids={gpu_ids}: choose CPU processes or GPUs"
            )
        if not is_int(cpu_processes) or cpu_processes < 1:
            raise ValueError(f"cpu_processes must be an integer >= 1, got {cpu_processes!r}")
        return
    if n_gpus is not None and (not is_int(n_gpus) or n_gpus < 1):
        raise ValueError(f"n_gpus must be an integer >= 1 (or None for all GPUs), got {n_gpus!r}")
    if gpu_ids is None:
        return
    if not isinstance(gpu_ids, (list, tuple)) or not all(is_int(gpu) for gpu in gpu_ids):
        raise ValueError(f"gpu_ids must be a list of GPU numbers such as [0, 1], got {gpu_ids!r}")
    ids = list(gpu_ids)
    if not ids:
        raise ValueError("gpu_ids is empty: give at least one GPU id")
    duplicates = sorted({gpu for gpu in ids if ids.count(gpu) > 1})
    if duplicates:
        raise ValueError(f"gpu_ids {ids} lists {duplicates} more than once: one process per GPU")
    if n_gpus is not None and n_gpus != len(ids):
        raise ValueError(f"n_gpus={n_gpus} disagrees with gpu_ids={ids} ({len(ids)} ids)")


def _devices_from_ids(gpu_ids: Sequence[int], visible: int) -> list[torch.device]:
    """Check explicit GPU ids against the visible devices; rank r uses ``cuda:{gpu_ids[r]}``."""
    bad = [gpu for gpu in gpu_ids if not 0 <= gpu < visible]
    if bad:
        raise ValueError(
            f"gpu_ids {bad} are not valid CUDA device ids: {visible} device(s) are visible (ids 0..{visible - 1})"
        )
    return [torch.device(f"cuda:{gpu}") for gpu in gpu_ids]


def resolve_devices(
    n_gpus: int | None = None,
    gpu_ids: Sequence[int] | None = None,
    cpu_processes: int | None = None,
) -> list[torch.device]:
    """The device of every rank of a request not checked before: ``check_device_request``,
    then ``located_devices``."""
    check_device_request(n_gpus, gpu_ids, cpu_processes)
    return located_devices(n_gpus, gpu_ids, cpu_processes)


def located_devices(n_gpus: int | None, gpu_ids: Sequence[int] | None, cpu_processes: int | None) -> list[torch.device]:
    """The device of every rank of a request whose form ``check_device_request`` checked, in
    rank order, found on this machine: ``cpu_processes=N`` gives N CPU ranks (gloo);
    otherwise ``gpu_ids`` picks GPUs explicitly and ``n_gpus`` takes the first ``n_gpus``
    visible ones (all when ``None``). Found here, in the parent, a GPU this machine lacks is
    one clear error instead of N crashed workers.
    """
    if cpu_processes is not None:
        return [torch.device("cpu") for _ in range(cpu_processes)]
    visible = _counted_cuda_devices()
    if gpu_ids is not None:
        return _devices_from_ids(gpu_ids, visible)
    count = visible if n_gpus is None else n_gpus
    if count > visible:
        raise ValueError(f"n_gpus={n_gpus} asks for more GPUs than the {visible} visible")
    return [torch.device(f"cuda:{index}") for index in range(count)]


def launched_rank_device(local_rank: int) -> torch.device:
    """The device of a rank started by torchrun or srun: the GPU of its local rank (modulo
    the visible GPUs), else the CPU."""
    count = visible_cuda_devices()
    return torch.device(f"cuda:{local_rank % count}") if count else torch.device("cpu")
