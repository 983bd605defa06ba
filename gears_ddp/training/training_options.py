"""The options of a training run, shared by ``GEARS.train`` (keyword arguments) and
``train_multi_gpu`` (its ``args`` dict, which adds the model and launch options).

Each option has one name, one meaning and one check, whichever way training is started. A
misspelt key or a bad value fails at once with a message naming it, before any data is
touched or any process starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gears_ddp._options import Options, is_int, is_number, option, option_name
from gears_ddp.data.loaders import check_loader_options

AMP_MODES = ("off", "fp16", "bf16")
LR_SCALINGS = ("none", "linear", "sqrt")
LOADER_OPTIONS = ("batch_size", "test_batch_size", "seed", "num_workers", "resample_controls")
# GEARS.train(epochs=0), as published: no optimiser step, then the test evaluation and report of
# the model as it is (the paper's no-perturbation baseline); a distributed run trains at least one epoch
UNTRAINED_TEST_ALLOWED_IN = "train"
PATH_OPTIONS = ("save_path", "resume_from", "linear_baseline_screen")
# Which options (of GEARS.train and of train_multi_gpu's args) a resumed run may give other values
# than the run that wrote its checkpoint; a resume with another value of one that must match is
# refused (``checkpoint.refuse_other_training_options``), since the run would end neither as the
# run it continues nor as a fresh one with the new value.
RESUME_OPTIONS = {
    # they shape the weights, the optimisation or the data order: the learning rate and its
    # schedule (lr, lr_scaling, warmup_steps; lr and weight_decay would be restored with the
    # optimiser's state anyway), the step (amp's precision and scaler, grad_accum_steps,
    # sync_batchnorm's statistics), the batches (batch_size: the sampler's position is counted in
    # them; seed and resample_controls: the shuffle and the control partners), the data
    # (expression_dtype's float16 rounds it, default_pert_graph chooses the graph) and the model
    "must match": (
        "lr",
        "weight_decay",
        "lr_scaling",
        "warmup_steps",
        "amp",
        "grad_accum_steps",
        "sync_batchnorm",
        "batch_size",
        "seed",
        "resample_controls",
        "expression_dtype",
        "default_pert_graph",
        "model_config",
    ),
    # how far training goes (training further is what a resume is for), where and how often the
    # run is saved (its report's pictures too), tracked and waited for, the evaluation's batches
    # and the test-only baseline, the loaders' worker processes (a batch is one gather, whoever
    # makes it), how the same step is computed (the same function in other kernels), where the
    # expression lives, an option that does nothing, and where the run trains (cpu_processes: a
    # changed number of ranks gets a warning of its own, recipe.TrainingRecipe._resume;
    # cpu_threads: the same run, its sums added up in another order)
    "may change": (
        "epochs",
        "max_steps",
        "checkpoint_every",
        "checkpoint_every_steps",
        "keep_checkpoints",
        "save_path",
        "resume_from",
        "overwrite_save_path",
        "report_pictures",
        "timeout_s",
        "wandb",
        "test_batch_size",
        "linear_baseline_screen",
        "num_workers",
        "fused_decoder",
        "compile",
        "cuda_graphs",
        "deterministic",
        "expression_storage",
        "find_unused_parameters",
        "cpu_processes",
        "cpu_threads",
    ),
}
# torch releases under which torch.compile fails on the GEARS network, whatever the device:
# 2.11.0's dynamo cannot trace the fused decoder (an autograd.Function) once a batch brings
# another number of perturbation sets, and where it compiles the network (on a GPU), the
# compiled backward pass gives zero gradients to every layer before the decoder's last
# (docs/training.md, "Compiling the step"; 2.9.1, 2.10.0, 2.12.1 and 2.13.0 compile it)
COMPILE_FAILS_UNDER_TORCH = ("2.11.0",)
# the oldest torch release measured to compile the network (2.9.1); under 2.4.0, the oldest that
# setup.py allows, dynamo refuses the fused decoder's matrix products into preallocated outputs
OLDEST_TORCH_THAT_COMPILES = "2.9"


def torch_compiles_the_network() -> bool:
    """Whether the installed torch is at least ``OLDEST_TORCH_THAT_COMPILES``."""
    return torch.torch_version.TorchVersion(str(torch.__version__).split("+")[0]) >= OLDEST_TORCH_THAT_COMPILES


def compile_refusal(option: str) -> str | None:
    """Why the option ``option`` (named as the user gave it) cannot be True under the
    installed torch, or None where it can."""
    release = str(torch.__version__).split("+")[0]
    remedy = f"or leave {option} False (the default)"
    if not torch_compiles_the_network():
        return (
            f"{option} is True, but torch.compile compiles the GEARS network from torch "
            f"{OLDEST_TORCH_THAT_COMPILES} on, and this is torch {torch.__version__} (under 2.4, dynamo "
            f"cannot trace the fused decoder): install a newer torch, {remedy}"
        )
    if release in COMPILE_FAILS_UNDER_TORCH:
        return (
            f"{option} is True, but torch.compile fails on the GEARS network under torch {torch.__version__} "
            "(its dynamo cannot trace the fused decoder once batches bring other numbers of perturbation "
            "sets, and where it compiles the network, the compiled backward pass gives zero gradients to "
            "every layer before the decoder's last): install a torch release other than "
            f"{', '.join(COMPILE_FAILS_UNDER_TORCH)} (2.12 and later compile it), {remedy}"
        )
    return None


@dataclass
class TrainingOptions(Options):
    """What ``GEARS.train`` accepts; see docs/options.md.

    The loader options (``LOADER_OPTIONS``) default to None here, meaning "as the loaders
    were built by ``PertData.get_dataloader``"; ``train_multi_gpu``, which builds the
    loaders itself, gives them values.
    """

    epochs: int = option(
        20,
        "training epochs (the published training: Adam, learning rate halved every epoch, "
        "gradient values clipped at 1.0); GEARS.train(epochs=0) scores the model as it is",
    )
    lr: float = option(1e-3, "learning rate (Adam), halved every epoch")
    weight_decay: float = option(5e-4, "Adam weight decay")
    amp: str = option(
        "off",
        "'off', 'bf16' or 'fp16' (with a gradient scaler: gradients unscaled before clipping, "
        "a step whose gradients overflow skipped and the scale lowered)",
    )
    seed: int | None = option(None, "shuffling and control pairing (and, in args, the initial weights)")
    max_steps: int | None = option(
        None, "stop after this many optimiser steps in all (the epoch then ends with its evaluation)"
    )
    batch_size: int | None = option(None, "cells per batch and process")
    test_batch_size: int | None = option(None, "cells per evaluation batch and process (None: batch_size)")
    num_workers: int | None = option(None, "loader worker processes")
    resample_controls: bool | None = option(None, "draw new control partners every epoch")
    grad_accum_steps: int = option(1, "micro-batches per optimiser step; gradients cross ranks once per step")
    lr_scaling: str = option("none", "'none', 'linear' or 'sqrt' of world_size x grad_accum_steps")
    warmup_steps: int = option(0, "linear learning-rate warmup over the first optimiser steps")
    checkpoint_every: int = option(0, "epochs between training checkpoints; 0: none")
    checkpoint_every_steps: int = option(0, "optimiser steps between training checkpoints; 0: none")
    keep_checkpoints: int = option(3, "the newest checkpoints kept in save_path/checkpoints")
    resume_from: str | None = option(
        None,
        "'auto' (the newest readable checkpoint in save_path, else a fresh start),"
        " a checkpoint file or a save folder; resuming continues exactly, "
        "mid-epoch too (on CPU bit for bit)",
    )
    save_path: str | None = option(
        None,
        "the run folder: model, checkpoints, metrics, log, report; held by this run "
        "alone while it trains (another run on it is refused), checked for write "
        "access and free space before training; None: nothing saved",
    )
    overwrite_save_path: bool = option(
        False,
        "train into a save_path that holds an earlier run (its model, report "
        "or checkpoints), replacing it; without it such a folder is refused "
        "(resume_from continues it instead)",
    )
    report_pictures: bool = option(
        True,
        "draw the run report's pictures (save_path/plots, shown in report.html); False writes the "
        "page and report.json without them, 2-4 CPU seconds sooner at the end of each run",
    )
    sync_batchnorm: bool = option(False, "BatchNorm statistics over all ranks' batches")
    fused_decoder: bool = option(
        True, "the per-gene decoder as one autograd function; False runs the plain module chain (the same function)"
    )
    compile: bool = option(
        False,
        "torch.compile the model for the training steps (its forward and backward "
        "passes; evaluation runs eagerly); the first steps wait for the compilation",
    )
    cuda_graphs: bool = option(
        True,
        "on a GPU, replay each optimiser step from one CUDA graph (two around the "
        "gradients' all-reduce with several ranks; batches' perturbation sets padded to "
        "a fixed number; the first steps run eagerly, then the step is captured); False "
        "launches its operators one by one. Not with sync_batchnorm on several ranks",
    )
    deterministic: bool = option(
        False,
        "torch's deterministic algorithms (on a GPU, sums without atomic additions): "
        "the same run gives the same weights bit for bit, somewhat slower",
    )
    wandb: dict | None = option(
        None,
        "{'project': ..., 'name': ...}: the main rank logs each epoch and the test "
        "summary to Weights & Biases (pip install wandb)",
    )
    linear_baseline_screen: str | None = option(
        None,
        "another Perturb-seq screen (a processed data folder, or an h5ad"
        " file with obs['condition'] and log-normalised X) whose PCA "
        "places the perturbations of the linear_pretrained baseline, "
        "as Ahlmann-Eltze et al.'s best linear model takes Replogle's "
        "K562 screen (docs/evaluation.md); None: no such baseline",
    )

    @classmethod
    def from_dict(cls, values: dict | None, where: str = "args"):
        return super().from_dict(values, where)

    def check(self, where: str) -> None:
        def name(key: str) -> str:
            return option_name(where, key)

        if where == UNTRAINED_TEST_ALLOWED_IN:
            if not (is_int(self.epochs) and self.epochs >= 0):
                raise ValueError(
                    f"{name('epochs')} must be a non-negative integer (0: no training, the model "
                    f"scored as it is), got {self.epochs!r}"
                )
        elif not (is_int(self.epochs) and self.epochs >= 1):
            raise ValueError(f"{name('epochs')} must be a positive integer, got {self.epochs!r}")
        check_loader_options(self.loader_options(), name)  # the loader options' one check, the loaders' own
        for key in ("max_steps", "grad_accum_steps", "keep_checkpoints"):
            value = getattr(self, key)
            if value is not None and not (is_int(value) and value >= 1):
                raise ValueError(f"{name(key)} must be a positive integer, got {value!r}")
        for key in ("checkpoint_every", "checkpoint_every_steps", "warmup_steps"):
            value = getattr(self, key)
            if value is not None and not (is_int(value) and value >= 0):
                raise ValueError(f"{name(key)} must be a non-negative integer, got {value!r}")
        for key, allowed in (("amp", AMP_MODES), ("lr_scaling", LR_SCALINGS)):
            value = getattr(self, key)
            if value not in allowed:
                unquoted = " (YAML reads an unquoted off as false: write 'off' in quotes)" if value is False else ""
                raise ValueError(f"{name(key)} must be one of {allowed}, got {value!r}{unquoted}")
        for key in ("lr", "weight_decay"):
            value = getattr(self, key)
            if not is_number(value) or value < 0 or (key == "lr" and value == 0):
                raise ValueError(
                    f"{name(key)} must be a {'positive' if key == 'lr' else 'non-negative'} number, got {value!r}"
                )
        for key in (
            "sync_batchnorm",
            "fused_decoder",
            "compile",
            "cuda_graphs",
            "deterministic",
            "overwrite_save_path",
        ):
            value = getattr(self, key)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name(key)} must be True or False, got {value!r}")
        if self.compile and (refusal := compile_refusal(name("compile"))):
            raise ValueError(refusal)
        if self.wandb is not None and not isinstance(self.wandb, dict):
            raise ValueError(f"{name('wandb')} must be a dict such as {{'project': 'GEARS', 'name': 'run1'}}")
        for key in ("checkpoint_every", "checkpoint_every_steps", "overwrite_save_path"):
            if getattr(self, key) and self.save_path is None:
                raise ValueError(
                    f"{name(key)}={getattr(self, key)} needs {name('save_path')}: the folder the checkpoints go to"
                )
        for key in PATH_OPTIONS:
            value = getattr(self, key)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(
                    f"{name(key)} must be a path{' or auto' if key == 'resume_from' else ''}, got {value!r}"
                )
        if self.resume_from not in (None, "auto") and not Path(self.resume_from).exists():
            raise FileNotFoundError(
                f"{name('resume_from')}={str(self.resume_from)!r}: no such checkpoint file or folder"
            )
        if self.linear_baseline_screen is not None and not Path(self.linear_baseline_screen).exists():
            raise FileNotFoundError(
                f"{name('linear_baseline_screen')}={str(self.linear_baseline_screen)!r}: no such "
                "processed data folder or h5ad file"
            )
        if self.resume_from == "auto" and self.save_path is None:
            raise ValueError(
                f"{name('resume_from')}='auto' needs {name('save_path')}: the folder whose latest "
                "checkpoint to continue from"
            )
        if self.resume_from is not None and self.overwrite_save_path:
            raise ValueError(
                f"{name('resume_from')} continues the run in {name('save_path')} and "
                f"{name('overwrite_save_path')} replaces it: give one of them"
            )

    def normalized(self):
        """The paths as plain strings (checkpoints store plain types)."""
        paths: dict[str, Any] = {key: str(getattr(self, key)) for key in PATH_OPTIONS if getattr(self, key) is not None}
        return dataclasses.replace(self, **paths) if paths else self

    def scaled_lr(self, world_size: int) -> float:
        """The learning rate for ``world_size`` processes: ``lr`` times the effective batch
        (``batch_size x world_size x grad_accum_steps``) over one process's ``batch_size``,
        or its square root, or 1 (``lr_scaling``)."""
        factor = world_size * self.grad_accum_steps
        return self.lr * {"none": 1.0, "linear": factor, "sqrt": math.sqrt(factor)}[self.lr_scaling]

    def with_loader_options(self, built: dict):
        """These options with each loader option left None ("as the loaders were built") given
        the value ``built`` (``PertData.loader_options`` of the loaders training uses) holds: what
        the run's checkpoints record, so that a resume on loaders built otherwise is told apart."""
        return dataclasses.replace(
            self, **{key: built[key] for key in LOADER_OPTIONS if getattr(self, key) is None and key in built}
        )

    def loader_options(self) -> dict:
        """The loader options that are set (not None)."""
        return {key: getattr(self, key) for key in LOADER_OPTIONS if getattr(self, key) is not None}


def changed_on_resume(saved: dict, options: TrainingOptions) -> list[str]:
    """The options that must match on a resume (``RESUME_OPTIONS``) whose value in ``options``
    differs from ``saved`` (the options a checkpoint was written with), each as
    ``'lr: 0.003 there, 0.1 here'``; ``model_config`` is compared option by option."""
    ours = options.as_dict()
    return [
        difference
        for key in RESUME_OPTIONS["must match"]
        if key in saved and key in ours
        for difference in _differences(key, saved[key], ours[key])
    ]


def _differences(name: str, there, here) -> list[str]:
    """``name``'s value ``there`` (a checkpoint's) against ``here`` (this run's), as
    ``changed_on_resume`` words them. Unknown, so never different: an option a checkpoint of an
    earlier version lacks (a dict's key too), and a loader option left None on either side
    (``GEARS.train``'s "as the loaders were built", which the options do not say)."""
    if isinstance(there, dict) and isinstance(here, dict):
        return [
            difference
            for key in sorted(here)
            if key in there
            for difference in _differences(f"{name}.{key}", there[key], here[key])
        ]
    if name in LOADER_OPTIONS and (there is None or here is None):
        return []
    return [] if there == here else [f"{name}: {there!r} there, {here!r} here"]
