"""Where this process sits in a job that a launcher started: torchrun (or any launcher that
sets the ``env://`` variables) or Slurm's ``srun``. Every process reads its rank, world size,
place on its machine and the rendezvous address from the environment with
``launch_environment``; a plain ``python`` start has none.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

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
            environment_integer(environ, "RANK"),
            environment_integer(environ, "WORLD_SIZE"),
            environment_integer(environ, "LOCAL_RANK"),
            environment_integer(environ, "LOCAL_WORLD_SIZE"),
            _text(environ, "MASTER_ADDR"),
            environment_integer(environ, "MASTER_PORT"),
            "torchrun",
        )
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    elif "SLURM_PROCID" in environ:
        environment = LaunchEnvironment(
            environment_integer(environ, "SLURM_PROCID"),
            environment_integer(environ, "SLURM_NTASKS"),
            environment_integer(environ, "SLURM_LOCALID"),
            _slurm_tasks_on_this_node(environ),
            _slurm_master_addr(environ),
            _slurm_master_port(environ),
            "slurm",
        )
        names = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE")
    else:
        return None
    for value, name, within in (
        (environment.rank, names[0], environment.world_size),
        (environment.local_rank, names[2], environment.local_world_size),
    ):
        if not 0 <= value < within:
            raise ValueError(f"{name}={value} is outside 0..{within - 1} (from {names[1 if name == names[0] else 3]})")
    return environment


def _text(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise ValueError(f"environment variable {name} is not set (the launcher sets it)")
    return value


def environment_integer(environ: Mapping[str, str], name: str) -> int:
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
        return environment_integer(environ, "MASTER_PORT")
    if "SLURM_JOB_ID" not in environ:
        raise ValueError("Slurm launch without a master port: set MASTER_PORT or SLURM_JOB_ID")
    return SLURM_PORT_BASE + environment_integer(environ, "SLURM_JOB_ID") % SLURM_PORT_SPAN


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
    node = environment_integer(environ, "SLURM_NODEID") if "SLURM_NODEID" in environ else 0
    if not 0 <= node < len(counts):
        raise ValueError(f"SLURM_NODEID={node} has no entry in {name}={environ[name]!r}")
    return counts[node]
