"""The GEARS training recipe, the one place where training happens.

``GEARS.train`` runs it in one process; every rank of ``train_multi_gpu`` and of a torchrun
or Slurm job runs it too, with a ``ProcessGroupRanks`` instead of ``SingleProcess``
(``gears_ddp.runtime.ranks``). Nothing else differs, so a run prototyped in one process
gives the same weights and metrics as the same run on one rank of a distributed job.

The recipe takes what it trains explicitly (``TrainingInputs``: the network, the loaders,
the loss context, a factory of evaluation accumulators, the device, an optional tracker)
and returns what training produced (``TrainingResult``: the best network, its epoch, the
history, the best network's test evaluation). It never sees the ``GEARS`` object: keeping
the best model, saving it and writing the report are the caller's (``GEARS.train_with``).

As in the published GEARS: Adam, ``StepLR(step_size=1, gamma=0.5)`` stepped every epoch,
gradient values clipped at 1.0; after every epoch the model is evaluated on train and val,
and the model with the lowest val ``mse_de`` is kept; the kept model is scored on test at
the end. Added: mixed precision, gradient accumulation, learning-rate warmup and scaling
with the effective batch, checkpoints every N epochs or optimiser steps with exact resume
(mid-epoch too), stopping cleanly on SIGTERM / SIGUSR1 / Ctrl-C, and stopping every rank at a
non-finite loss before anything is evaluated or saved (``finite_loss``).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol, cast

import torch
from torch import nn
from tqdm import tqdm

from gears_ddp._logging import get_logger
from gears_ddp.data.screen_report import listed
from gears_ddp.evaluation.metrics import EvaluationAccumulator, EvaluationResult, compute_metrics
from gears_ddp.model.losses import LossContext
from gears_ddp.model.model_folder import parameter_digest
from gears_ddp.model.network import GEARSModel
from gears_ddp.model.weighted_norm import WeightedBatchNorm1d
from gears_ddp.report.run_files import write_history
from gears_ddp.runtime.determinism import deterministic_algorithms
from gears_ddp.runtime.host_memory import retained_host_memory
from gears_ddp.runtime.ranks import SINGLE_PROCESS, SingleProcess
from gears_ddp.runtime.stopping import StopSignals, TrainingInterrupted, described_signal, signal_name
from gears_ddp.runtime.threads import at_most_usable_threads
from gears_ddp.training.checkpoint import (
    refuse_other_training_options,
    restore_rng_states,
    save_training_checkpoint,
)
from gears_ddp.training.cuda_graphs import CapturedStep, use_cuda_graphs
from gears_ddp.training.engine import Precision, evaluate, optimizer_steps, training_step, unwrapped
from gears_ddp.training.finite_loss import LossWatch
from gears_ddp.training.optimization import Warmup, make_optimizer
from gears_ddp.training.training_options import TrainingOptions

logger = get_logger(__name__)
LOG_EVERY_STEPS = 50


class Tracker(Protocol):
    """An experiment tracker (a Weights & Biases run): ``log`` gets each epoch's record."""

    def log(self, data: dict) -> None: ...


@dataclass
class TrainingInputs:
    """What the recipe trains: the ``network`` (initialised, on ``device``), this rank's
    ``loaders`` (``train_loader``, ``train_eval_loader``, ``val_loader`` and, when the split
    has one, ``test_loader``), the loss's per-condition gene sets (``loss_context``), a
    factory of empty evaluation accumulators (``new_accumulator``), whether the network is
    in ``uncertainty`` mode, and an optional ``tracker`` (an experiment tracker with
    ``log(dict)``, such as a Weights & Biases run, that gets each epoch's record; the main
    rank's only)."""

    network: GEARSModel
    loaders: dict
    loss_context: LossContext
    new_accumulator: Callable[[], EvaluationAccumulator]
    uncertainty: bool
    device: torch.device
    tracker: Tracker | None = None


@dataclass
class TrainingResult:
    """What ``TrainingRecipe.run`` returns: the network with the best weights (lowest val
    ``mse_de``; in evaluation mode), their epoch (1-based), the per-epoch history, the best
    network's evaluation on the test set (all ranks' cells; None without a test set),
    each rank's digest of its final weights (equal on every rank of a sound run) and the
    wall seconds of the run's two phases, ``'epochs'`` (training and the per-epoch
    evaluation) and ``'test'`` (the best network restored and evaluated on test)."""

    best_network: GEARSModel
    best_epoch: int
    history: list[dict]
    test_result: EvaluationResult | None
    parameter_digests: list[str]
    phase_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainingOutcome:
    """What training produced so far: the best model's state dict (on CPU), its epoch
    (0-based) and val ``mse_de``, and the per-epoch history. A checkpoint stores it."""

    best_state: dict | None = None
    best_epoch: int = -1
    best_value: float = math.inf
    history: list[dict] = field(default_factory=list)


@dataclass
class TrainingPosition:
    """Where training stands, at an optimiser-step boundary: the epoch in progress (0-based),
    the optimiser steps done in it and in all, and each rank's sum of the epoch's step losses
    so far (in rank order; empty at the start of an epoch)."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    epoch_loss_sums: list[float] = field(default_factory=list)

    def described(self) -> str:
        """Where training stands, as a checkpoint's line says it: ``after epoch 1 (optimiser
        step 25 in all)`` between epochs, else ``in epoch 2, after optimiser step 7 of the epoch
        (32 in all)``."""
        if self.step_in_epoch == 0:
            return f"after epoch {self.epoch} (optimiser step {self.global_step} in all)"
        return (
            f"in epoch {self.epoch + 1}, after optimiser step {self.step_in_epoch} of the epoch "
            f"({self.global_step} in all)"
        )

    def loss_sum_of(self, rank: int, world_size: int) -> float:
        """The loss sum rank ``rank`` continues from (with another number of ranks than the
        checkpoint's, the main rank carries the whole sum)."""
        if len(self.epoch_loss_sums) == world_size:
            return self.epoch_loss_sums[rank]
        return float(sum(self.epoch_loss_sums)) if rank == 0 else 0.0


class TrainingRecipe:
    """Train ``inputs.network`` on ``inputs.loaders`` as this process's rank of ``ranks``.

    ``run()`` trains the remaining epochs and returns a ``TrainingResult``, continuing from
    ``resume`` (the checkpoint ``TrainingOptions.resume_from`` names, read once by whoever started
    the run: ``checkpoint.resolve_resume``), if given. With ``TrainingOptions.save_path`` (a folder
    the caller holds and checked with ``save_folder.held_save_path``), the main rank writes the per-epoch
    metrics and the checkpoints there, and a SIGTERM, SIGUSR1 or Ctrl-C stops every rank at the next optimiser step with
    a checkpoint (``run()`` raises ``TrainingInterrupted``). A non-finite loss stops every
    rank with ``NonFiniteLoss`` before anything else is evaluated or saved.
    """

    def __init__(
        self,
        inputs: TrainingInputs,
        options: TrainingOptions,
        ranks: SingleProcess = SINGLE_PROCESS,
        resume: tuple[Path, dict] | None = None,
    ):
        self.inputs, self.options, self.ranks = inputs, options, ranks
        self.device = inputs.device
        self.save_path = Path(options.save_path) if options.save_path is not None else None
        network = inputs.network
        network.fused_decoder = options.fused_decoder
        synchronized_batchnorm = options.sync_batchnorm and ranks.world_size > 1
        for module in network.modules():
            if isinstance(module, WeightedBatchNorm1d):
                module.synchronize = synchronized_batchnorm
        self.precision = Precision.for_mode(options.amp, self.device)
        self.optimizer, self.scheduler = make_optimizer(
            network, options.scaled_lr(ranks.world_size), options.weight_decay
        )
        self.outcome, self.position = TrainingOutcome(), TrainingPosition()
        self._resume(resume)
        ranks.share_parameters(network)
        self.gradients = ranks.gradient_average(network)
        self.warmup = Warmup(options.warmup_steps, self.position.global_step)
        # on a GPU each step replays CUDA graphs, on batches of a fixed number of perturbation sets
        self.captured = (
            CapturedStep(self.device, micro_batches=options.grad_accum_steps)
            if use_cuda_graphs(options.cuda_graphs, self.device, synchronized_batchnorm)
            else None
        )
        if options.cuda_graphs and self.device.type == "cuda" and synchronized_batchnorm and ranks.is_main:
            logger.info(
                "sync_batchnorm: BatchNorm statistics cross ranks inside the forward pass, so training "
                "steps run eagerly (no CUDA graph holds a collective)"
            )
        self.pad_sets_to = inputs.loaders["train_loader"].max_sets_per_batch() if self.captured else None
        # torch.compile of a Module is a Module (an OptimizedModule wrapping it)
        self.model = cast(nn.Module, torch.compile(network)) if options.compile else network
        self.tracker = inputs.tracker if ranks.is_main else None
        self.signals = StopSignals()
        self.losses = LossWatch(self.device, self.precision.scaler, self.position.global_step)

    def run(self) -> TrainingResult:
        """Train the remaining epochs; then the best network and its test evaluation."""
        loaders = self.inputs.loaders
        if self.ranks.is_main and self.position.epoch < self.options.epochs:  # none left: no range to name
            logger.info(
                "training epochs %d-%d on %d %s rank(s), %d optimiser step(s) per epoch and rank",
                self.position.epoch + 1,
                self.options.epochs,
                self.ranks.world_size,
                self.device.type,
                math.ceil(len(loaders["train_loader"]) / self.options.grad_accum_steps),
            )
        on_cpu = self.device.type == "cpu"
        started = time.perf_counter()
        with deterministic_algorithms(self.options.deterministic):
            with (
                at_most_usable_threads() if on_cpu else contextlib.nullcontext(),
                self.signals if self.save_path is not None else contextlib.nullcontext(),
                tqdm(
                    total=self.options.epochs,
                    initial=self.position.epoch,
                    desc="epochs",
                    unit="epoch",
                    disable=not self.ranks.is_main or None,
                ) as epochs,
            ):
                while self.position.epoch < self.options.epochs and self._epoch_to_run():
                    self._train_epoch(loaders)
                    epochs.update()
            return self._finish(time.perf_counter() - started)

    def _train_epoch(self, loaders: dict) -> None:
        """The rest of the current epoch, its evaluation on train and val, the best-model
        choice, and the checkpoints that fall in it."""
        tick = time.perf_counter()
        epoch, options, position = self.position.epoch, self.options, self.position
        loader = loaders["train_loader"]
        loader.set_epoch(epoch)
        first = position.step_in_epoch * options.grad_accum_steps
        batches = tqdm(
            loader.batches(first, self.pad_sets_to),
            total=len(loader),
            initial=first,
            desc=f"epoch {epoch + 1}",
            disable=not self.ranks.is_main or None,
            leave=False,
        )
        loss_sum = torch.tensor(
            position.loss_sum_of(self.ranks.rank, self.ranks.world_size), dtype=torch.float32, device=self.device
        )
        # freed memory is retained for the optimiser steps only: an evaluation's batch blocks,
        # alternating with small pieces, would keep a retaining heap growing with the cells
        steps_left = not self._steps_done()  # none when resumed from the step that reached max_steps
        with retained_host_memory() if self.device.type == "cpu" else contextlib.nullcontext():
            for loss in (
                optimizer_steps(
                    self.model,
                    batches,
                    self.optimizer,
                    self.inputs.loss_context,
                    self.inputs.uncertainty,
                    self.device,
                    self.precision,
                    options.grad_accum_steps,
                    self.gradients,
                    self.warmup,
                    self.captured or training_step,
                )
                if steps_left
                else ()
            ):
                loss_sum += loss
                self.losses.record(loss)
                position.step_in_epoch += 1
                position.global_step += 1
                if position.step_in_epoch % LOG_EVERY_STEPS == 1:
                    self.losses.check(self.ranks, position)
                    if self.ranks.is_main:
                        logger.info("epoch %d step %d: train loss %.4f", epoch + 1, position.step_in_epoch, loss.item())
                if options.checkpoint_every_steps and position.global_step % options.checkpoint_every_steps == 0:
                    self._save_checkpoint(loss_sum)
                if self.save_path is not None:
                    self._stop_if_asked(loss_sum)
                if self._steps_done():
                    break
        self.losses.check(self.ranks, position)  # before the epoch's evaluation, best-model choice and checkpoint
        self.scheduler.step()
        totals = self.ranks.sum(
            torch.stack(
                [loss_sum.detach().cpu().double(), torch.tensor(float(position.step_in_epoch), dtype=torch.float64)]
            )
        )
        train_loss = float(totals[0] / totals[1].clamp(min=1))
        train_seconds = time.perf_counter() - tick
        network = unwrapped(self.model)
        self.ranks.broadcast_buffers(network)  # evaluate with the main rank's running statistics everywhere
        train_metrics = self._metrics(loaders["train_eval_loader"], "evaluating train")
        val_metrics = self._metrics(loaders["val_loader"], "evaluating val")
        record = {
            "epoch": epoch + 1,
            "train_loss": train_loss,
            "train_seconds": train_seconds,
            "seconds": time.perf_counter() - tick,
            **{f"train_{k}": v for k, v in train_metrics.items()},
            **{f"val_{k}": v for k, v in val_metrics.items()},
        }
        self.outcome.history.append(record)
        if self.ranks.is_main:
            logger.info(
                "epoch %d/%d: train loss %.4f, train mse %.4f / mse_de %.4f, val mse %.4f / mse_de %.4f (%.1f s)",
                epoch + 1,
                options.epochs,
                train_loss,
                train_metrics["mse"],
                train_metrics["mse_de"],
                val_metrics["mse"],
                val_metrics["mse_de"],
                record["seconds"],
            )
        if self.tracker is not None:
            self.tracker.log(record)
        if self.save_path is not None and self.ranks.is_main:
            write_history(self.save_path, self.outcome.history)
        if val_metrics["mse_de"] < self.outcome.best_value:
            self.outcome.best_value, self.outcome.best_epoch = val_metrics["mse_de"], epoch
            self.outcome.best_state = _cpu_state(network)
        self.position = TrainingPosition(epoch + 1, 0, position.global_step)
        if options.checkpoint_every and (epoch + 1) % options.checkpoint_every == 0:
            self._save_checkpoint()

    def _steps_done(self) -> bool:
        """Whether ``max_steps`` optimiser steps are done."""
        return self.options.max_steps is not None and self.position.global_step >= self.options.max_steps

    def _epoch_to_run(self) -> bool:
        """Whether the current epoch has work left: steps to take, or, begun (a run resumed
        from a checkpoint of its last step), its end: the scheduler step and the evaluation."""
        return not self._steps_done() or self.position.step_in_epoch > 0

    def _metrics(self, loader, progress: str) -> dict:
        result = evaluate(
            self.model,
            loader,
            self.inputs.new_accumulator(),
            self.inputs.uncertainty,
            self.device,
            self.precision,
            self.ranks,
            progress=progress,
        )
        return compute_metrics(result)[0]

    def _stop_if_asked(self, loss_sum: torch.Tensor) -> None:
        """At a step boundary: when a rank received a stop signal, every rank stops here, after
        the main rank wrote a checkpoint."""
        number = self.ranks.largest(self.signals.received)
        if not number:
            return
        path = self._save_checkpoint(loss_sum)
        raise TrainingInterrupted(
            f"training stopped on {described_signal(number)} in epoch {self.position.epoch + 1}, after optimiser step "
            f"{self.position.step_in_epoch} of the epoch ({self.position.global_step} in all); checkpoint "
            f"{path}; continue with resume_from='auto' and the same save_path",
            signal_name(number),
            str(path),
        )

    def _save_checkpoint(self, loss_sum: torch.Tensor | None = None) -> Path | None:
        """The main rank writes the training state, with every rank's ``loss_sum`` of the
        epoch so far (mid-epoch); every rank waits for it. Returns its path (None on the
        other ranks). A checkpoint
        never holds the weights of a non-finite loss: the losses are checked first."""
        self.losses.check(self.ranks, self.position)
        if loss_sum is not None:
            self.position.epoch_loss_sums = self.ranks.gather(float(loss_sum))
        path = None
        if self.ranks.is_main:
            path = save_training_checkpoint(
                self.save_path,
                {
                    "position": asdict(self.position),
                    "model": _cpu_state(unwrapped(self.model)),
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "scaler": self.precision.scaler.state_dict() if self.precision.scaler is not None else None,
                    "outcome": asdict(self.outcome),
                    "options": self.options.as_dict(),
                    "world_size": self.ranks.world_size,
                },
                self.options.keep_checkpoints,
            )
            logger.info("checkpoint %s written to %s", self.position.described(), path)
        self.ranks.barrier()
        return path

    def _resume(self, found: tuple[Path, dict] | None) -> None:
        """Continue from ``found``, the checkpoint ``TrainingOptions.resume_from`` names as whoever
        started the run read it (``checkpoint.resolve_resume``), if any: weights, optimiser,
        schedule, scaler, random states, position and outcome so far. A checkpoint of another
        model, or written with other options that shape the training, is refused."""
        if found is None:
            if self.options.resume_from == "auto" and self.ranks.is_main:
                logger.info("resume_from='auto': no checkpoint in %s, starting from the beginning", self.save_path)
            return
        path, state = found
        refuse_other_weights(path, state["model"], self.inputs.network.state_dict())
        refuse_other_training_options(path, state, self.options)
        self.inputs.network.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.precision.scaler is not None and state["scaler"] is not None:
            self.precision.scaler.load_state_dict(state["scaler"])
        restore_rng_states(state["rng"])
        if state["world_size"] != self.ranks.world_size:
            logger.warning(
                "resuming a run of %d rank(s) with %d: the data order differs from the original run",
                state["world_size"],
                self.ranks.world_size,
            )
        self.position, self.outcome = TrainingPosition(**state["position"]), TrainingOutcome(**state["outcome"])
        if self.ranks.is_main:
            logger.info(
                "resuming from %s: epoch %d, after optimiser step %d of the epoch",
                path,
                self.position.epoch + 1,
                self.position.step_in_epoch,
            )

    def _finish(self, epoch_seconds: float) -> TrainingResult:
        """The best network (the current one when no epoch chose one: none ran, or val
        ``mse_de`` was NaN) and its evaluation on the test set; ``epoch_seconds``: the
        epochs' wall time."""
        tick = time.perf_counter()
        network = unwrapped(self.model)
        if self.outcome.best_state is None:
            self.outcome.best_state = _cpu_state(network)
        digests = self.ranks.gather(parameter_digest(network))
        best = copy.deepcopy(network)
        best.load_state_dict(self.outcome.best_state)
        best.eval()
        test_loader = self.inputs.loaders.get("test_loader")
        test_result = (
            None
            if test_loader is None
            else evaluate(
                best,
                test_loader,
                self.inputs.new_accumulator(),
                self.inputs.uncertainty,
                self.device,
                ranks=self.ranks,
                progress="evaluating test",
            )
        )
        return TrainingResult(
            best,
            self.outcome.best_epoch + 1,
            self.outcome.history,
            test_result,
            digests,
            {"epochs": epoch_seconds, "test": time.perf_counter() - tick},
        )


def refuse_other_weights(path: Path, saved: dict, ours: dict) -> None:
    """Refuse to continue from the checkpoint ``path`` when its weights (``saved``) are not
    this model's (``ours``): the model options differ from those it was trained with, and
    loading would fail with a list of every mismatched tensor."""
    shapes = [
        f"{name}: {list(tensor.shape)} there, {list(ours[name].shape)} here"
        for name, tensor in saved.items()
        if name in ours and tensor.shape != ours[name].shape
    ]
    names = sorted(set(saved) ^ set(ours))
    if shapes or names:
        found = listed(shapes, 3, separator="; ") or f"weights {listed(names, 3)} in one and not the other"
        raise ValueError(
            f"resume_from: {path} holds the weights of another model ({found}): give the model the options it "
            "was trained with (model_initialize; args.model_config), or start afresh (overwrite_save_path=True)"
        )


def _cpu_state(model: nn.Module) -> dict:
    """A copy of the model's state dict on the CPU."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
