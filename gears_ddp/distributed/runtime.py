"""Process-group plumbing for distributed training.

Three ways of starting the workers are supported:

* ``torch.multiprocessing.spawn`` on one machine: the parent chooses the devices with
  :func:`resolve_devices` and a rendezvous port with :func:`find_free_port`, and every child
  calls :func:`setup_ddp` with its rank.
* ``torchrun`` (or any launcher that sets the ``env://`` variables) and Slurm ``srun``: every
  process reads its rank, world size and rendezvous address with :func:`launch_environment`.
* Machines without GPUs: ``cpu_processes=N`` gives N CPU processes using the gloo backend.

Everything here is small and side-effect free apart from :func:`setup_ddp`,
:func:`cleanup_ddp` and :func:`barrier`, so the launch logic can be tested without a GPU.
"""
from __future__ import annotations

import itertools
import os
import re
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping, Sequence

import torch
import torch.distributed as dist

from gears_ddp._logging import get_logger

logger = get_logger(__name__)

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

# Slurm has no rendezvous port of its own. Every task of a job must pick the same port without
# talking to the others (they have not met yet: that is what the port is for), so it is derived
# from the job id, which all tasks share. Different jobs sharing a node then get different
# ports (unless their ids differ by a multiple of 20000). The range 20000-39999 stays above
# the well-known and common service ports.
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 20000


@dataclass(frozen=True)
class LaunchEnvironment:
    """Where this process sits in a launched job, as told by the launcher's variables.

    ``source`` is ``'torchrun'`` (the ``env://`` variables) or ``'slurm'``.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str


# ----------------------------------------------------------------------------- launch variables


def _int_variable(environ: Mapping[str, str], name: str) -> int:
    """Read the integer variable ``name``; a missing or non-integer value names the variable."""
    if name not in environ:
        raise ValueError(f"environment variable {name} is not set")
    raw = environ[name].strip()
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={environ[name]!r} is not an integer") from None


def _validate_port(port: int, variable: str) -> int:
    """Check that ``port`` is a usable TCP port; the error names where it came from."""
    if not 1 <= port <= 65535:
        raise ValueError(f"{variable}={port} is not a TCP port (expected 1..65535)")
    return port


def _validate_ranks(
    env: LaunchEnvironment, rank_var: str, world_var: str, local_var: str
) -> LaunchEnvironment:
    """Check rank, world size and local rank for consistency; errors name the variables."""
    if env.world_size < 1:
        raise ValueError(f"{world_var}={env.world_size} must be at least 1")
    if not 0 <= env.rank < env.world_size:
        raise ValueError(
            f"{rank_var}={env.rank} is outside 0..{env.world_size - 1} ({world_var}={env.world_size})"
        )
    if env.local_rank < 0:
        raise ValueError(f"{local_var}={env.local_rank} must not be negative")
    _validate_port(env.master_port, "MASTER_PORT")
    if not env.master_addr:
        raise ValueError("the master address is empty (MASTER_ADDR or the Slurm node list)")
    return env


def _torchrun_environment(environ: Mapping[str, str]) -> LaunchEnvironment:
    """Read the ``env://`` variables that torchrun sets; all five are required."""
    missing = [name for name in _TORCHRUN_VARIABLES if name not in environ]
    if missing:
        raise ValueError(
            "RANK is set, so this looks like a torchrun/env:// launch, but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set "
            f"(all of {', '.join(_TORCHRUN_VARIABLES)} are required)"
        )
    env = LaunchEnvironment(
        rank=_int_variable(environ, "RANK"),
        world_size=_int_variable(environ, "WORLD_SIZE"),
        local_rank=_int_variable(environ, "LOCAL_RANK"),
        master_addr=environ["MASTER_ADDR"].strip(),
        master_port=_int_variable(environ, "MASTER_PORT"),
        source="torchrun",
    )
    return _validate_ranks(env, "RANK", "WORLD_SIZE", "LOCAL_RANK")


def _slurm_master_addr(environ: Mapping[str, str]) -> str:
    """``MASTER_ADDR`` if set, else the first host of the job's node list."""
    if environ.get("MASTER_ADDR", "").strip():
        return environ["MASTER_ADDR"].strip()
    for name in ("SLURM_NODELIST", "SLURM_JOB_NODELIST"):
        if environ.get(name, "").strip():
            return expand_nodelist(environ[name])[0]
    raise ValueError(
        "Slurm launch without a master address: set MASTER_ADDR or SLURM_NODELIST/SLURM_JOB_NODELIST"
    )


def _slurm_master_port(environ: Mapping[str, str]) -> int:
    """``MASTER_PORT`` if set, else a port every task derives from the shared job id."""
    if "MASTER_PORT" in environ:
        return _int_variable(environ, "MASTER_PORT")
    if "SLURM_JOB_ID" not in environ:
        raise ValueError("Slurm launch without a master port: set MASTER_PORT or SLURM_JOB_ID")
    job_id = _int_variable(environ, "SLURM_JOB_ID")
    return SLURM_PORT_BASE + job_id % SLURM_PORT_SPAN


def _slurm_environment(environ: Mapping[str, str]) -> LaunchEnvironment:
    """Read the variables ``srun`` sets for each task (one task per GPU)."""
    env = LaunchEnvironment(
        rank=_int_variable(environ, "SLURM_PROCID"),
        world_size=_int_variable(environ, "SLURM_NTASKS"),
        local_rank=_int_variable(environ, "SLURM_LOCALID"),
        master_addr=_slurm_master_addr(environ),
        master_port=_slurm_master_port(environ),
        source="slurm",
    )
    return _validate_ranks(env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


def launch_environment(environ: Mapping[str, str] = os.environ) -> LaunchEnvironment | None:
    """Describe how this process was launched, or ``None`` when no launcher is detected.

    The torchrun/``env://`` variables take precedence (torchrun under Slurm sets both), then
    Slurm's per-task variables. ``None`` means a plain ``python`` start: the caller then
    spawns its own workers. Note that inside an ``sbatch`` script (outside ``srun``) Slurm
    already sets ``SLURM_PROCID=0``; start the training with ``srun`` so that all tasks exist.
    """
    if "RANK" in environ:
        return _torchrun_environment(environ)
    if "SLURM_PROCID" in environ:
        return _slurm_environment(environ)
    return None


# ----------------------------------------------------------------------------- Slurm node lists

_BRACKET_GROUP = re.compile(r"(\[[^\[\]]*\])")
_RANGE_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top_level(nodelist: str) -> list[str]:
    """Split a node list at the commas outside brackets, checking the brackets balance."""
    parts, current, depth = [], [], 0
    for char in nodelist:
        if char == "[":
            if depth:
                raise ValueError(f"nested '[' in Slurm node list {nodelist!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError(f"unmatched ']' in Slurm node list {nodelist!r}")
            depth = 0
        elif char == "," and not depth:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    if depth:
        raise ValueError(f"unclosed '[' in Slurm node list {nodelist!r}")
    parts.append("".join(current))
    return parts


def _expand_bracket(group: str, nodelist: str) -> list[str]:
    """Expand the inside of one bracket group, e.g. ``'01-03,07'``, keeping zero padding."""
    values = []
    for item in group.split(","):
        match = _RANGE_ITEM.match(item.strip())
        if not match:
            raise ValueError(f"bad range {item!r} in [{group}] of Slurm node list {nodelist!r}")
        low_text, high_text = match.group(1), match.group(2)
        low, high = int(low_text), int(high_text if high_text is not None else low_text)
        if high < low:
            raise ValueError(f"descending range {item!r} in Slurm node list {nodelist!r}")
        width = len(low_text)
        values.extend(str(number).zfill(width) for number in range(low, high + 1))
    return values


def _expand_host(expression: str, nodelist: str) -> list[str]:
    """Expand one host expression such as ``'r[1-2]n[01-02]-ib'`` (cartesian product, in order)."""
    if not expression:
        raise ValueError(f"empty host name in Slurm node list {nodelist!r}")
    if any(char.isspace() for char in expression):
        raise ValueError(f"whitespace inside host {expression!r} of Slurm node list {nodelist!r}")
    choices = []
    for piece in _BRACKET_GROUP.split(expression):
        if piece.startswith("["):
            choices.append(_expand_bracket(piece[1:-1], nodelist))
        elif piece:
            choices.append([piece])
    return ["".join(combination) for combination in itertools.product(*choices)]


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list into host names, in order.

    ``'node[01-03,07]'`` gives node01, node02, node03, node07 (zero padding is kept);
    ``'gpu[1-2],cpu5'``, ``'a[1-2]-ib,b3'`` and ``'r[1-2]n[01-02]'`` work as Slurm does.
    Needed because ``SLURM_NODELIST`` is the only place every task can read the first node's
    name from; Python cannot call ``scontrol show hostnames`` portably.
    """
    if not isinstance(nodelist, str) or not nodelist.strip():
        raise ValueError(f"empty Slurm node list {nodelist!r}")
    text = nodelist.strip()
    hosts: list[str] = []
    for expression in _split_top_level(text):
        hosts.extend(_expand_host(expression, text))
    return hosts


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
    """Number of CUDA devices this process can use, raising when there are none."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 1:
        raise ValueError(
            "no CUDA device is visible (torch.cuda.is_available() is False or no device is "
            "counted); to train without GPUs pass cpu_processes=N (args['cpu_processes']) to "
            "run N CPU processes with the gloo backend instead"
        )
    return count


def _devices_from_ids(gpu_ids: Sequence[int], n_gpus: int | None, visible: int) -> list[torch.device]:
    """Check explicit GPU ids against the visible devices; rank r uses ``cuda:{gpu_ids[r]}``."""
    ids = list(gpu_ids)
    if not ids:
        raise ValueError("gpu_ids is empty: give at least one GPU id")
    bad = [gpu for gpu in ids if not _is_int(gpu) or not 0 <= gpu < visible]
    if bad:
        raise ValueError(
            f"gpu_ids {bad} are not valid CUDA device ids: {visible} device(s) are visible "
            f"(ids 0..{visible - 1})"
        )
    duplicates = sorted({gpu for gpu in ids if ids.count(gpu) > 1})
    if duplicates:
        raise ValueError(f"gpu_ids {ids} lists {duplicates} more than once: one process per GPU")
    if n_gpus is not None and n_gpus != len(ids):
        raise ValueError(f"n_gpus={n_gpus} disagrees with gpu_ids={ids} ({len(ids)} ids)")
    return [torch.device(f"cuda:{gpu}") for gpu in ids]


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
    if n_gpus is not None and (not _is_int(n_gpus) or n_gpus < 1):
        raise ValueError(f"n_gpus must be an integer >= 1 (or None for all GPUs), got {n_gpus!r}")
    visible = _visible_cuda_devices()
    if gpu_ids is not None:
        return _devices_from_ids(gpu_ids, n_gpus, visible)
    count = visible if n_gpus is None else n_gpus
    if count > visible:
        raise ValueError(f"n_gpus={n_gpus} asks for more GPUs than the {visible} visible")
    return [torch.device(f"cuda:{index}") for index in range(count)]


def backend_for(device: torch.device) -> str:
    """The collective backend for a device: NCCL for CUDA, gloo for everything else."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


# ----------------------------------------------------------------------------- process group


def _rendezvous_port(master_port: int | None) -> int:
    """The given port, else ``MASTER_PORT`` from the environment, else an error."""
    if master_port is not None:
        return _validate_port(int(master_port), "master_port")
    if "MASTER_PORT" not in os.environ:
        raise ValueError(
            "no rendezvous port: pass master_port (e.g. find_free_port()) or set MASTER_PORT"
        )
    return _validate_port(_int_variable(os.environ, "MASTER_PORT"), "MASTER_PORT")


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
    try:
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
        )
    except (RuntimeError, TimeoutError, OSError) as error:
        raise RuntimeError(
            f"rank {rank} of world size {world_size} could not initialise the {backend} process "
            f"group at {master_addr}:{port} within the {timeout_s:g} s timeout: some rank did not "
            f"join (check that all {world_size} processes started and agree on the master "
            f"address and port) [{type(error).__name__}: {error}]"
        ) from error


def cleanup_ddp() -> None:
    """Destroy the default process group if there is one (safe to call more than once)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_main_process() -> bool:
    """True on rank 0, and in a single process with no process group (it is the main one)."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    return dist.get_rank() == 0


def barrier() -> None:
    """Wait for every rank when a process group exists; nothing to wait for otherwise."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
