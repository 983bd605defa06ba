"""Cluster environments: where the ranks of a run come from, as the process's variables tell
it. Each environment class says whether it is the one this process runs in (``detect``) and
owns the rank, the world size, the place on the machine and the rendezvous address and port
of one rank, and what its scheduler does on a stop or a restart:

- ``LocalEnvironment``: ranks started on this machine, by this library (``train_multi_gpu``
  spawns them) or by a script's ``mp.spawn`` (``train_ddp_worker``); they meet at
  127.0.0.1, at the port given, else ``MASTER_PORT``, else a free one (or the published
  worker's 12355);
- ``TorchrunEnvironment``: a rank torchrun started (or any launcher that sets the ``env://``
  variables); its restart attempt keeps the keys of each attempt apart in the agent's store;
- ``SlurmEnvironment``: a task ``srun`` started; its port derives from the job id, and
  SIGUSR1 requeues the job.

``pick_environment`` chooses among them. This module is the only one that reads or writes
the launchers' variables (``tests/test_launch.py`` checks it), and it imports nothing from
gears_ddp: the run folder's lock (``runtime.folder_lock``), far below launching, reads the
scheduler job's identity here (``this_job``).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
from dataclasses import dataclass, replace
from typing import ClassVar, MutableMapping

logger = logging.getLogger(__name__)

LOCAL_HOST = "127.0.0.1"
DEFAULT_RENDEZVOUS_PORT = 12355  # the published worker API's port, taken when neither a port nor MASTER_PORT is given
# Slurm has no rendezvous port of its own. Every task of a job must pick the same port without
# talking to the others, so it is derived from the job id, which all tasks share; jobs sharing
# a node then get different ports (unless their ids differ by a multiple of 20000).
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 20000

Environ = MutableMapping[str, str]


@dataclass(frozen=True)
class ClusterEnvironment:
    """One rank's place in a run: its rank among ``world_size``, its place among the
    ``local_world_size`` ranks of its machine (which share the machine's cores), and the
    address and port where the ranks meet."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    name: ClassVar[str] = "a cluster"
    started_by_a_launcher: ClassVar[bool] = True  # torchrun or srun started this process as one rank

    @classmethod
    def detect(cls, environ: Environ) -> bool:
        """Whether the variables ``environ`` say that this process runs in this environment."""
        raise NotImplementedError

    def requeue_on(self, signal_name: str) -> None:
        """What the scheduler does when the ranks stopped on ``signal_name`` (with a
        checkpoint): nothing, but for Slurm's requeue."""


@dataclass(frozen=True)
class LocalEnvironment(ClusterEnvironment):
    """A rank on this machine, started by this library or by a script's ``mp.spawn``; the
    ranks meet at 127.0.0.1 unless told otherwise."""

    name: ClassVar[str] = "local processes"
    started_by_a_launcher: ClassVar[bool] = False

    @classmethod
    def detect(cls, environ: Environ) -> bool:
        """No launcher's variables: the ranks are processes started on this machine."""
        return not any(launched.detect(environ) for launched in LAUNCHED)

    @staticmethod
    def rendezvous_port(port: int | None = None, default: int | None = None, environ: Environ = os.environ) -> int:
        """The port local ranks meet at: ``port``, else ``MASTER_PORT``, else ``default``,
        else a free one; a TCP port either way."""
        if port is not None:
            chosen = int(port)
        elif environ.get("MASTER_PORT"):
            chosen = environment_integer(environ, "MASTER_PORT")
        else:
            chosen = default if default is not None else find_free_port()
        if not 1 <= chosen <= 65535:
            raise ValueError(f"rendezvous port {chosen} is not a TCP port (1..65535)")
        return chosen

    @classmethod
    def spawned(
        cls, world_size: int, port: int, first_local_rank: int = 0, local_world_size: int | None = None
    ) -> list[LocalEnvironment]:
        """The ranks spawned on this machine, in rank order, meeting at ``port``.
        ``first_local_rank`` and ``local_world_size`` place them among other ranks sharing
        the machine's cores (several replicates at once)."""
        machine = world_size if local_world_size is None else local_world_size
        first = cls(0, world_size, first_local_rank, machine, LOCAL_HOST, port)
        return [replace(first, rank=rank, local_rank=first_local_rank + rank) for rank in range(world_size)]


@dataclass(frozen=True)
class TorchrunEnvironment(ClusterEnvironment):
    """A rank torchrun started (or any launcher that sets the ``env://`` variables)."""

    name: ClassVar[str] = "torchrun"

    @classmethod
    def detect(cls, environ: Environ) -> bool:
        return "RANK" in environ

    @classmethod
    def from_environ(cls, environ: Environ) -> TorchrunEnvironment:
        environment = cls(
            environment_integer(environ, "RANK"),
            environment_integer(environ, "WORLD_SIZE"),
            environment_integer(environ, "LOCAL_RANK"),
            environment_integer(environ, "LOCAL_WORLD_SIZE"),
            _text(environ, "MASTER_ADDR"),
            environment_integer(environ, "MASTER_PORT"),
        )
        _check_ranks(environment, ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
        return environment

    @staticmethod
    def restart_attempt(environ: Environ = os.environ) -> str:
        """Torchrun's restarts of the workers so far (``'0'`` outside torchrun): the ranks of
        each attempt keep their keys apart in the agent's store, which outlives a restart."""
        return environ.get("TORCHELASTIC_RESTART_COUNT", "0")

    @staticmethod
    def agent_serves_the_store(environ: Environ = os.environ) -> bool:
        """Whether torchrun's agent serves the store the ranks meet in (torch's
        ``TORCHELASTIC_USE_AGENT_STORE``): then every rank is its client, and none serves one."""
        return environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"

    @staticmethod
    def run_id(environ: Environ = os.environ) -> str | None:
        """Torchrun's run id (``'?'`` for a torchrun that names none), None outside torchrun."""
        return environ.get("TORCHELASTIC_RUN_ID") or ("?" if "TORCHELASTIC_RESTART_COUNT" in environ else None)


@dataclass(frozen=True)
class SlurmEnvironment(ClusterEnvironment):
    """A task ``srun`` started. Inside an ``sbatch`` script but outside ``srun`` Slurm already
    sets ``SLURM_PROCID=0``: start the training with ``srun`` so that all tasks exist."""

    name: ClassVar[str] = "slurm"

    @classmethod
    def detect(cls, environ: Environ) -> bool:
        return "SLURM_PROCID" in environ

    @classmethod
    def from_environ(cls, environ: Environ) -> SlurmEnvironment:
        environment = cls(
            environment_integer(environ, "SLURM_PROCID"),
            environment_integer(environ, "SLURM_NTASKS"),
            environment_integer(environ, "SLURM_LOCALID"),
            _slurm_tasks_on_this_node(environ),
            cls.master_address(environ),
            cls.master_port_of(environ),
        )
        _check_ranks(environment, ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"))
        return environment

    @staticmethod
    def master_address(environ: Environ) -> str:
        """``MASTER_ADDR`` if set, else the first host of the job's node list."""
        if environ.get("MASTER_ADDR", "").strip():
            return environ["MASTER_ADDR"].strip()
        for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            if environ.get(name, "").strip():
                return first_slurm_host(environ[name])
        raise ValueError("Slurm launch without a master address: set MASTER_ADDR or SLURM_JOB_NODELIST")

    @staticmethod
    def master_port_of(environ: Environ) -> int:
        """``MASTER_PORT`` if set, else a port every task derives from the shared job id."""
        if environ.get("MASTER_PORT", "").strip():
            return environment_integer(environ, "MASTER_PORT")
        if "SLURM_JOB_ID" not in environ:
            raise ValueError("Slurm launch without a master port: set MASTER_PORT or SLURM_JOB_ID")
        return SLURM_PORT_BASE + environment_integer(environ, "SLURM_JOB_ID") % SLURM_PORT_SPAN

    @staticmethod
    def job_id(environ: Environ = os.environ) -> str | None:
        """The Slurm job's id (which a requeued job keeps), None outside Slurm."""
        return environ.get("SLURM_JOB_ID") or None

    @staticmethod
    def restart_count(environ: Environ = os.environ) -> str:
        """How often the job was requeued so far."""
        return environ.get("SLURM_RESTART_COUNT", "0")

    def requeue_on(self, signal_name: str) -> None:
        """On SIGUSR1 (``sbatch --signal=USR1@90``), put the job back in the queue (it must
        have been submitted with ``--requeue``); it then continues from the checkpoint."""
        if signal_name == "SIGUSR1":
            requeue_slurm_job(self.job_id())


LAUNCHED: tuple[type[TorchrunEnvironment | SlurmEnvironment], ...] = (TorchrunEnvironment, SlurmEnvironment)


def pick_environment(environ: Environ = os.environ) -> TorchrunEnvironment | SlurmEnvironment | None:
    """The launcher's environment this process was started in, read from ``environ``, or
    ``None`` for a plain ``python`` start (``LocalEnvironment``: its ranks are processes
    started on this machine). torchrun's variables take precedence (torchrun under Slurm sets
    both), then Slurm's per-task ones."""
    for environment in LAUNCHED:
        if environment.detect(environ):
            return environment.from_environ(environ)
    return None


def publish_rendezvous_address(master_addr: str, master_port: int, environ: Environ = os.environ) -> None:
    """Set the address the ``env://`` rendezvous reads (``MASTER_ADDR`` and ``MASTER_PORT``)."""
    environ["MASTER_ADDR"] = master_addr
    environ["MASTER_PORT"] = str(master_port)


def this_job(environ: Environ = os.environ) -> dict | None:
    """The scheduler job this process belongs to (None outside one): ``scheduler`` and ``id``
    (Slurm's job id, which a requeued job keeps, else torchrun's run id) and ``attempt``,
    the restarts so far: ``[Slurm's requeues]`` and/or ``[torchrun's restarts]``, in that
    order, so that a later attempt compares greater."""
    slurm, torchrun = SlurmEnvironment.job_id(environ), TorchrunEnvironment.run_id(environ)
    if not (slurm or torchrun):
        return None
    attempt = []
    for present, count in (
        (slurm, SlurmEnvironment.restart_count),
        (torchrun, TorchrunEnvironment.restart_attempt),
    ):
        if present:
            try:
                attempt.append(int(count(environ) or 0))
            except ValueError:
                attempt.append(0)
    return {"scheduler": "slurm" if slurm else "torchrun", "id": slurm or torchrun, "attempt": attempt}


def is_restart(job: dict | None) -> bool:
    """Whether ``job`` (``this_job()``) is a restarted or requeued attempt."""
    return job is not None and any(job["attempt"])


def requeue_slurm_job(job: str | None) -> None:
    """Put the Slurm job ``job`` back in the queue (it must have been submitted with ``--requeue``)."""
    problem: str | None = "no job id"
    try:
        if job is not None:
            done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
            problem = done.stderr.strip() if done.returncode else None
    except (OSError, subprocess.SubprocessError) as err:  # no scontrol
        problem = f"{type(err).__name__}: {err}"
    if problem:
        logger.warning("could not requeue Slurm job %s (%s); resubmit it to continue from the checkpoint", job, problem)
    else:
        logger.warning("Slurm job %s requeued", job)


def find_free_port(host: str = LOCAL_HOST) -> int:
    """Return a TCP port the OS reports free on ``host`` (bind to port 0, read it, close).

    The port is free when this returns; another process could take it before the rendezvous
    binds it, which is unlikely enough for launching workers on one machine.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _check_ranks(environment: ClusterEnvironment, names: tuple[str, str, str, str]) -> None:
    """Refuse a rank outside its world (the names: rank, world size, local rank, local world size)."""
    for value, name, within, of in (
        (environment.rank, names[0], environment.world_size, names[1]),
        (environment.local_rank, names[2], environment.local_world_size, names[3]),
    ):
        if not 0 <= value < within:
            raise ValueError(f"{name}={value} is outside 0..{within - 1} (from {of})")


def _text(environ: Environ, name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise ValueError(f"environment variable {name} is not set (the launcher sets it)")
    return value


def environment_integer(environ: Environ, name: str) -> int:
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


def _slurm_tasks_on_this_node(environ: Environ) -> int:
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
