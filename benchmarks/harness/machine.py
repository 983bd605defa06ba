"""The machine a benchmark runs on, in words: what it is (for a recorded section's header)
and how busy it is (timings on a shared machine move with its load)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe_machine() -> str:
    """CPU model and cores, GPU, torch and CUDA versions."""
    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = (
        f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}, CUDA {torch.version.cuda}"
        if torch.cuda.is_available()
        else "no GPU"
    )
    return f"{cpu}, {cores} cores; {gpu}; torch {torch.__version__}"


def load_average() -> str:
    """The 1-minute load average, as ``uptime`` prints it."""
    return f"{os.getloadavg()[0]:.1f}"
