"""A torchrun job started by a benchmark: ``torchrun --standalone`` with some processes on
this machine, in an environment free of the variables of any launcher that started the
benchmark itself, so that the job is a job of its own."""

from __future__ import annotations

import os
import sys

# what torchrun (or srun, or a job that started this process) sets for its workers
LAUNCHER_VARIABLES = ("RANK", "LOCAL_", "WORLD_", "GROUP_", "ROLE_", "MASTER_", "TORCHELASTIC_")


def torchrun_command(processes: int, *arguments: str) -> list[str]:
    """``torchrun --standalone --nproc_per_node=processes ARGUMENTS`` with this Python."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *arguments]


def job_environment(extra: dict | None = None) -> dict:
    """This process's environment without launcher variables, with ``extra`` added."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith(LAUNCHER_VARIABLES)}
    environment.update({key: str(value) for key, value in (extra or {}).items()})
    return environment
