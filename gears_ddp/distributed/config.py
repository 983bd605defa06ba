"""The options of distributed training, validated before any process starts.

``train_multi_gpu(..., split_config, args)`` takes plain dicts (the guide's interface);
``SplitConfig.from_dict`` and ``TrainingArgs.from_dict`` turn them into checked dataclasses,
so a misspelt key or a bad value fails at once with a message naming it, not after a
minute of spawning processes.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import asdict, dataclass, field, fields

from gears_ddp.data.pertdata import PertData
from gears_ddp.engine import AMP_MODES
from gears_ddp.gears import GEARS

LR_SCALINGS = ("none", "linear", "sqrt")


def _parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


MODEL_OPTIONS = tuple(name for name in _parameters(GEARS.model_initialize) if not name.startswith("G_"))
MODEL_DEFAULTS = {name: parameter.default for name, parameter in
                  inspect.signature(GEARS.model_initialize).parameters.items() if name in MODEL_OPTIONS}
SPLIT_OPTIONS = tuple(_parameters(PertData.prepare_split))


def _reject_unknown(given: dict, known, what: str) -> None:
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"unknown {what} key(s) {unknown}; known keys: {sorted(known)}")


@dataclass
class SplitConfig:
    """``PertData.prepare_split`` options (``split``, ``seed``, ``train_gene_set_size``, ...)."""

    options: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, split_config: dict | None) -> "SplitConfig":
        split_config = dict(split_config or {})
        _reject_unknown(split_config, SPLIT_OPTIONS, "split_config")
        return cls(split_config)


@dataclass
class TrainingArgs:
    """Everything ``args`` may hold; see the README for each option."""

    model_config: dict = field(default_factory=dict)
    batch_size: int = 32            # per process
    test_batch_size: int | None = None
    epochs: int = 20
    lr: float = 1e-3
    weight_decay: float = 5e-4
    save_path: str = "./runs/gears_ddp"
    amp: str = "off"                # 'off', 'fp16' (CUDA, with GradScaler), 'bf16'
    grad_accum_steps: int = 1
    lr_scaling: str = "none"        # 'none', 'linear', 'sqrt' of world_size x grad_accum_steps
    warmup_steps: int = 0           # linear learning-rate warmup over the first optimiser steps
    num_workers: int = 0
    seed: int = 0
    checkpoint_every: int = 0       # epochs between training checkpoints; 0: none
    resume_from: str | None = None  # a training checkpoint to continue from
    sync_batchnorm: bool = False    # BatchNorm statistics over all ranks' batches (CPU and GPU)
    find_unused_parameters: bool = False
    wandb: dict | None = None       # {'project': ..., 'name': ...}: log from rank 0
    cpu_processes: int | None = None  # run this many gloo processes on CPU instead of GPUs
    resample_controls: bool = False
    timeout_s: float = 600.0        # how long ranks wait for each other

    @classmethod
    def from_dict(cls, args: dict | None) -> "TrainingArgs":
        args = dict(args or {})
        _reject_unknown(args, [f.name for f in fields(cls)], "args")
        _reject_unknown(args.get("model_config") or {}, MODEL_OPTIONS, "args['model_config']")
        parsed = cls(**args)
        parsed.model_config = dict(parsed.model_config or {})
        parsed._check()
        return parsed

    def _check(self) -> None:
        positive = {"batch_size": self.batch_size, "epochs": self.epochs, "grad_accum_steps": self.grad_accum_steps}
        if self.test_batch_size is not None:
            positive["test_batch_size"] = self.test_batch_size
        if self.cpu_processes is not None:
            positive["cpu_processes"] = self.cpu_processes
        for name, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"args['{name}'] must be a positive integer, got {value!r}")
        for name in ("num_workers", "checkpoint_every", "warmup_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"args['{name}'] must be a non-negative integer, got {value!r}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"args['amp'] must be one of {AMP_MODES}, got {self.amp!r}")
        if self.lr_scaling not in LR_SCALINGS:
            raise ValueError(f"args['lr_scaling'] must be one of {LR_SCALINGS}, got {self.lr_scaling!r}")
        for name in ("lr", "weight_decay", "timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
                    or (name != "weight_decay" and value == 0):
                raise ValueError(f"args['{name}'] must be a positive number, got {value!r}")
        if self.wandb is not None and not isinstance(self.wandb, dict):
            raise ValueError("args['wandb'] must be a dict such as {'project': 'GEARS', 'name': 'run1'}")

    def scaled_lr(self, world_size: int) -> float:
        """The learning rate for ``world_size`` processes: ``lr`` times the effective batch
        (``batch_size x world_size x grad_accum_steps``) over one process's ``batch_size``,
        or its square root, or 1 (``lr_scaling``)."""
        factor = world_size * self.grad_accum_steps
        return self.lr * {"none": 1.0, "linear": factor, "sqrt": math.sqrt(factor)}[self.lr_scaling]

    def as_dict(self) -> dict:
        return asdict(self)
