"""Process-group plumbing for distributed training.

Three ways of starting the ranks are supported:

* ``torch.multiprocessing.spawn`` on one machine: the parent chooses the devices with
  :func:`resolve_devices` and a rendezvous port with :func:`find_free_port`, and every child
  calls :func:`setup_ddp` with its rank.
* ``torchrun`` (or any launcher that sets the ``env://`` variables) and Slurm ``srun``: every
  process reads its rank, world size and rendezvous address with :func:`launch_environment`.
* Machines without GPUs: ``cpu_processes=N`` gives N CPU processes using the gloo backend.

Only :func:`setup_ddp` and :func:`cleanup_ddp` touch the process group; the rest can be
tested without one.
"""
from __future__ import annotations

import gc
import os
import re
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping, Sequence

import torch
import torch.distributed as dist

from gears_ddp._logging import get_logger
from gears_ddp.runtime.devices import mps_available

logger = get_logger(__name__)

# Slurm has no rendezvous port of its own. Every task of a job must pick the same port without
# talking to the others, so it is derived from the job id, which all tasks share; jobs sharing
# a node then get different ports (unless their ids differ by a multiple of 20000).
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 20000


@dataclass(frozen=True)
class LaunchEnvironment:
    """Where this process sits in a launched job, as told by the launcher's variables:
    its rank among ``world_size``, its place among the ``local_world_size`` processes of
    its machine, the rendezvous address, and ``source`` (``'torchrun'`` or ``'slurm'``)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str


def launch_environment(environ: Mapping[str, str] = os.environ) -> LaunchEnvironment | None:
    """Describe how this process was launched, or ``None`` for a plain ``python`` start.

    torchrun's variables take precedence (torchrun under Slurm sets both), then Slurm's
    per-task ones. Inside an ``sbatch`` script but outside ``srun`` Slurm already sets
    ``SLURM_PROCID=0``: start the training with ``srun`` so that all tasks exist.
    """
    if "RANK" in environ:
        environment = LaunchEnvironment(
            _integer(environ, "RANK"), _integer(environ, "WORLD_SIZE"), _integer(environ, "LOCAL_RANK"),
            _integer(environ, "LOCAL_WORLD_SIZE"), _text(environ, "MASTER_ADDR"), _integer(environ, "MASTER_PORT"),
            "torchrun")
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    elif "SLURM_PROCID" in environ:
        environment = LaunchEnvironment(
            _integer(environ, "SLURM_PROCID"), _integer(environ, "SLURM_NTASKS"), _integer(environ, "SLURM_LOCALID"),
            _slurm_tasks_on_this_node(environ), _slurm_master_addr(environ), _slurm_master_port(environ), "slurm")
        names = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE")
    else:
        return None
    for value, name, within in ((environment.rank, names[0], environment.world_size),
                                (environment.local_rank, names[2], environment.local_world_size)):
        if not 0 <= value < within:
            raise ValueError(f"{name}={value} is outside 0..{within - 1} (from {names[1 if name == names[0] else 3]})")
    return environment


def _text(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise ValueError(f"environment variable {name} is not set (the launcher sets it)")
    return value


def _integer(environ: Mapping[str, str], name: str) -> int:
    """The integer variable ``name``; a missing or non-integer value names the variable."""
    value = _text(environ, name)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``'gpu[07-08],cpu1'`` gives ``gpu07``,
    ``'r[2-3]n[01-02]'`` gives ``r2n01``."""
    first = re.match(r"(?:[^,\[]|\[[^\]]*\])+", nodelist.strip())
    if first is None:
        raise ValueError(f"cannot read a host from the Slurm node list {nodelist!r}")
    return re.sub(r"\[([^\],-]*)[^\]]*\]", r"\1", first.group(0))


def _slurm_master_addr(environ: Mapping[str, str]) -> str:
    """``MASTER_ADDR`` if set, else the first host of the job's node list."""
    if environ.get("MASTER_ADDR", "").strip():
        return environ["MASTER_ADDR"].strip()
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if environ.get(name, "").strip():
            return first_slurm_host(environ[name])
    raise ValueError("Slurm launch without a master address: set MASTER_ADDR or SLURM_JOB_NODELIST")


def _slurm_master_port(environ: Mapping[str, str]) -> int:
    """``MASTER_PORT`` if set, else a port every task derives from the shared job id."""
    if environ.get("MASTER_PORT", "").strip():
        return _integer(environ, "MASTER_PORT")
    if "SLURM_JOB_ID" not in environ:
        raise ValueError("Slurm launch without a master port: set MASTER_PORT or SLURM_JOB_ID")
    return SLURM_PORT_BASE + _integer(environ, "SLURM_JOB_ID") % SLURM_PORT_SPAN


def _slurm_tasks_on_this_node(environ: Mapping[str, str]) -> int:
    """How many tasks of this step run on this task's node, from Slurm's compressed
    per-node counts (``'4(x2),3'``: 4 on each of the first two nodes, 3 on the third)."""
    name = next((n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if n in environ), None)
    if name is None:
        raise ValueError("Slurm launch without SLURM_STEP_TASKS_PER_NODE: start the tasks with srun")
    counts = []
    for item in environ[name].split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            raise ValueError(f"cannot read {name}={environ[name]!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    node = _integer(environ, "SLURM_NODEID") if "SLURM_NODEID" in environ else 0
    if not 0 <= node < len(counts):
        raise ValueError(f"SLURM_NODEID={node} has no entry in {name}={environ[name]!r}")
    return counts[node]


# ----------------------------------------------------------------------------- ports and devices


def find_free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port the OS reports free on ``host`` (bind to port 0, read it, close).

    The port is free when this returns; another process could take it before the rendezvous
    binds it, which is unlikely enough for launching workers on one machine.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _is_int(value: object) -> bool:
    """True for real integers (``bool`` excluded, since ``True`` as a count is a mistake)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _cpu_devices(cpu_processes: int, n_gpus: int | None, gpu_ids: Sequence[int] | None) -> list[torch.device]:
    """``cpu_processes`` CPU devices (gloo workers); GPU arguments must not be combined with it."""
    if n_gpus is not None or gpu_ids is not None:
        raise ValueError(
            f"cpu_processes={cpu_processes} cannot be combined with n_gpus={n_gpus} or "
            f"gpu_ids={gpu_ids}: choose CPU processes or GPUs"
        )
    if not _is_int(cpu_processes) or cpu_processes < 1:
        raise ValueError(f"cpu_processes must be an integer >= 1, got {cpu_processes!r}")
    return [torch.device("cpu") for _ in range(cpu_processes)]


def _visible_cuda_devices() -> int:
    """Number of CUDA devices this process can use, raising when there are none (with what
    to do instead on a Mac, whose one GPU, MPS, distributed training does not use)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
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
            "counted); to train without GPUs pass cpu_processes=N (args['cpu_processes']) to "
            "run N CPU processes with the gloo backend instead"
        )
    return count


def check_device_request(n_gpus: int | None, gpu_ids: Sequence[int] | None) -> None:
    """Check the form of a GPU request, before any GPU is looked at.

    ``n_gpus`` must be a count >= 1 and ``gpu_ids`` a non-empty list of distinct integers of
    the same length. A configuration file is checked with this when it is read, so a typo
    fails there and names the file, not when the workers start.
    """
    if n_gpus is not None and (not _is_int(n_gpus) or n_gpus < 1):
        raise ValueError(f"n_gpus must be an integer >= 1 (or None for all GPUs), got {n_gpus!r}")
    if gpu_ids is None:
        return
    if not isinstance(gpu_ids, (list, tuple)) or not all(_is_int(gpu) for gpu in gpu_ids):
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
            f"gpu_ids {bad} are not valid CUDA device ids: {visible} device(s) are visible "
            f"(ids 0..{visible - 1})"
        )
    return [torch.device(f"cuda:{gpu}") for gpu in gpu_ids]


def resolve_devices(
    n_gpus: int | None = None,
    gpu_ids: Sequence[int] | None = None,
    cpu_processes: int | None = None,
) -> list[torch.device]:
    """The device of every rank, in rank order, checked against what this machine has.

    ``cpu_processes=N`` gives N CPU ranks (gloo); otherwise ``gpu_ids`` picks GPUs explicitly
    and ``n_gpus`` takes the first ``n_gpus`` visible ones (all when ``None``). Checking here,
    in the parent, turns a bad id into one clear error instead of N crashed workers.
    """
    if cpu_processes is not None:
        return _cpu_devices(cpu_processes, n_gpus, gpu_ids)
    check_device_request(n_gpus, gpu_ids)
    visible = _visible_cuda_devices()
    if gpu_ids is not None:
        return _devices_from_ids(gpu_ids, visible)
    count = visible if n_gpus is None else n_gpus
    if count > visible:
        raise ValueError(f"n_gpus={n_gpus} asks for more GPUs than the {visible} visible")
    return [torch.device(f"cuda:{index}") for index in range(count)]


def backend_for(device: torch.device) -> str:
    """The collective backend for a device: NCCL for CUDA, gloo for everything else."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


# ----------------------------------------------------------------------------- process group


def _rendezvous_port(master_port: int | None) -> int:
    """The given port, else ``MASTER_PORT`` from the environment; a TCP port either way."""
    port = int(master_port) if master_port is not None else _integer(os.environ, "MASTER_PORT")
    if not 1 <= port <= 65535:
        raise ValueError(f"rendezvous port {port} is not a TCP port (1..65535)")
    return port


def setup_ddp(
    rank: int,
    world_size: int,
    device: torch.device | str = "cpu",
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    timeout_s: float = 600.0,
) -> None:
    """Join the default process group as ``rank`` of ``world_size`` on ``device``.

    Sets ``MASTER_ADDR``/``MASTER_PORT`` for the ``env://`` rendezvous, selects the CUDA device
    first (so NCCL binds to the right GPU) and initialises NCCL for CUDA or gloo otherwise.
    ``timeout_s`` bounds both the rendezvous and later collectives: a rank that never joins
    becomes a clear RuntimeError rather than a silent hang.

    Under torchrun the ranks meet in the agent's store, which outlives a restart of the
    workers; the keys of each attempt (``TORCHELASTIC_RESTART_COUNT``) get a prefix of their
    own, so restarted ranks never read the addresses the previous attempt left there.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} (world_size={world_size})")
    if dist.is_initialized():
        raise RuntimeError(
            f"rank {rank}: a process group is already initialised; call cleanup_ddp() first"
        )
    device = torch.device(device)
    port = _rendezvous_port(master_port)
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(port)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = backend_for(device)
    logger.debug(
        "rank %d/%d joining %s process group at %s:%d on %s",
        rank, world_size, backend, master_addr, port, device,
    )
    timeout = timedelta(seconds=timeout_s)
    try:
        store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(backend, store=dist.PrefixStore(f"gears_ddp/attempt_{attempt}", store), rank=rank,
                                world_size=world_size, timeout=timeout)
    except (RuntimeError, TimeoutError, OSError) as error:
        raise RuntimeError(
            f"rank {rank} of world size {world_size} could not initialise the {backend} process "
            f"group at {master_addr}:{port} within the {timeout_s:g} s timeout: some rank did not "
            f"join (check that all {world_size} processes started and agree on the master "
            f"address and port) [{type(error).__name__}: {error}]"
        ) from error


def cleanup_ddp() -> None:
    """Destroy the default process group if there is one (safe to call more than once).

    Unreachable objects are collected first, while Python still runs: a DDP model, which
    lives in reference cycles, is otherwise collected during interpreter shutdown, where
    releasing its collectives can make a gloo thread wait for the interpreter lock that
    shutdown has given up, and the process aborts after its work is done.
    """
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
