"""The owner of a GEARS model's training: the recipe run on the model's network and loaders,
the best model scored on test beside the baselines, and the run report.

``GEARS.train``, ``GEARS.train_with`` and ``GEARS.test`` each hand this module explicit
parts (the data, the model's options and device, the network, the loaders) and keep what
comes back (``TrainedModel``); a distributed rank runs the same ``Trainer.train`` through
``GEARS.train_with``. Nothing here reads a ``GEARS`` object: what only the front can do (keep
the best model it shows, save it, check the test interactions, which need inference) is
handed in as callables.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from torch import nn

from gears_ddp._logging import get_logger
from gears_ddp.evaluation.baselines import baseline_results
from gears_ddp.evaluation.linear_baseline import PerturbationEmbedding, other_screen_embedding
from gears_ddp.evaluation.metrics import EvaluationAccumulator, EvaluationResult, MetricContext
from gears_ddp.evaluation.prediction_spread import spread_line, spread_ratio, spread_warnings
from gears_ddp.evaluation.scoring import score
from gears_ddp.model.losses import LossContext
from gears_ddp.model.network import GEARSModel
from gears_ddp.report.examples import prediction_examples
from gears_ddp.report.run_files import log_file, write_run_report
from gears_ddp.report.verdicts import (
    GEARS,
    compare,
    per_perturbation_record,
    summary_verdicts,
    verdict_records,
    verdict_table,
)
from gears_ddp.runtime.phase_clock import PhaseClock
from gears_ddp.runtime.ranks import SINGLE_PROCESS, SingleProcess
from gears_ddp.training.checkpoint import resolve_resume
from gears_ddp.training.engine import evaluate
from gears_ddp.training.recipe import TrainingInputs, TrainingRecipe, TrainingResult
from gears_ddp.training.tracking import start_wandb
from gears_ddp.training.training_options import TrainingOptions

logger = get_logger(__name__)


class ReadFromOptions:
    """The ``resume`` of a run whose starter did not read its checkpoint: the trainer reads
    ``TrainingOptions.resume_from`` itself, once."""


READ_FROM_OPTIONS = ReadFromOptions()


def loaders_for(pert_data, options: TrainingOptions, device) -> dict:
    """The loaders ``GEARS.train`` trains on: those ``pert_data.get_dataloader`` built, or,
    when ``options`` set a loader option to another value or the device is a GPU (whose
    batches are gathered into page-locked memory, from which the copy does not block), new
    ones for this call alone: ``pert_data``'s stay as they were built, so a ``batch_size``
    given to one call is not the next call's (nor another ``GEARS``'s on the same data)."""
    built = pert_data.loader_options
    wanted = {**built, **options.loader_options(), "pin_memory": device.type == "cuda"}
    return pert_data.dataloader if wanted == built else pert_data.new_loaders(**wanted)


@dataclass
class TrainedModel:
    """What ``Trainer.train`` produced: the report ``GEARS.train`` returns, the tracker in use
    (a Weights & Biases run, or None), and the test evaluations of the model and of the
    baselines (None and empty without a test set)."""

    report: dict
    tracker: object | None
    test_evaluation: EvaluationResult | None = None
    baseline_evaluations: dict = field(default_factory=dict)


class Trainer:
    """Trains and scores one GEARS network on ``pert_data`` (split and loaders prepared).

    ``config``: the model's options (``uncertainty``, ``direction_lambda``,
    ``uncertainty_reg``, ...) as ``GEARS.config`` holds them; ``device``: the network's;
    ``tracker``: a Weights & Biases run (or None).
    """

    def __init__(self, pert_data, config: dict, device, tracker=None):
        self.pert_data, self.config, self.device, self.tracker = pert_data, config, device, tracker
        self.test_evaluation: EvaluationResult | None = None
        self.baseline_evaluations: dict = {}

    def loss_context(self) -> LossContext:
        """The loss's per-condition gene sets and control mean, on the model's device."""
        return LossContext.from_pert_data(
            self.pert_data, self.config["direction_lambda"], self.config["uncertainty_reg"]
        ).to(self.device)

    def new_accumulator(self) -> EvaluationAccumulator:
        """An empty per-condition accumulator for one evaluation pass."""
        return EvaluationAccumulator.from_pert_data(self.pert_data, self.config["uncertainty"], self.device)

    def other_screen(self, path) -> PerturbationEmbedding | None:
        """The perturbations of the screen at ``path`` placed by its PCA, checked against this
        screen's training conditions (None without a path)."""
        return None if path is None else other_screen_embedding(path, self.pert_data.set2conditions["train"])

    def train(
        self,
        network: GEARSModel,
        loaders: dict,
        options: TrainingOptions,
        ranks: SingleProcess,
        clock: PhaseClock,
        resume,
        keep: Callable[[TrainingResult], None],
        test_interactions: Callable[[], dict | None],
        save: Callable[[str], None],
    ) -> TrainedModel:
        """The recipe on ``network`` and ``loaders`` as this process's rank of ``ranks``
        (``options`` checked, ``TrainingOptions.save_path`` checked by whoever started the run; the
        checkpoint to continue from, ``resume``, read once by it, or ``READ_FROM_OPTIONS``);
        then ``keep(result)`` (the front keeps the best network), the test scores beside the
        baselines, and, on the main rank with a ``save_path``, ``test_interactions()``,
        ``save(save_path)`` and the run report.

        The report (what ``GEARS.train`` returns): ``'model'`` and ``'baselines'`` test
        summaries, ``'best_epoch'``, ``'history'``, ``'world_size'``, ``'parameter_digests'``
        (each rank's final weights), ``'timing'`` (the wall seconds of each phase on this rank:
        a rank's start-up if ``clock`` holds it, set-up, epochs, test, baselines and, with a
        run report, interactions and report; also the last line of the main rank's log) and,
        with ``save_path``, ``'model_path'`` and ``'interactions'`` (the run report's check of
        the observed test combinations, which ``GEARS.interaction_agreement()`` gives on
        demand)."""
        with clock.phase("set-up"):
            if ranks.is_main and self.tracker is None and options.wandb:
                self.tracker = start_wandb(**options.wandb)
            if ranks.is_main and self.tracker is not None:
                self.tracker.config.update({"training": options.as_dict(), "world_size": ranks.world_size})
            written = options.save_path if ranks.is_main else None  # the folder this rank writes to
            writes = written is not None
            if written is not None:  # checked by whoever started the run; made here for a rank started by hand
                Path(written).mkdir(parents=True, exist_ok=True)
            other_screen = self.other_screen(options.linear_baseline_screen)  # read (and checked) before training
            if isinstance(resume, ReadFromOptions):
                resume = resolve_resume(options.resume_from, options.save_path)
        with log_file(options.save_path) if writes else contextlib.nullcontext():
            with clock.phase("set-up"):
                inputs = TrainingInputs(
                    network,
                    loaders,
                    self.loss_context(),
                    self.new_accumulator,
                    self.config["uncertainty"],
                    self.device,
                    self.tracker if ranks.is_main else None,
                )
                recipe = TrainingRecipe(inputs, options, ranks, resume)
            result = recipe.run()
            for phase, seconds in result.phase_seconds.items():
                clock.add(phase, seconds)
            keep(result)
            report = self._tested(result, ranks, other_screen, clock, test_interactions if writes else None)
            report.update(
                best_epoch=result.best_epoch,
                history=result.history,
                world_size=ranks.world_size,
                parameter_digests=result.parameter_digests,
                timing=clock.seconds,
            )  # the clock's own dict: the report phase joins it
            if options.save_path is not None:
                self._save(report, options, result.best_epoch, ranks, clock, save)
            if ranks.is_main:
                logger.info("%s", clock.line())
        return TrainedModel(report, self.tracker, self.test_evaluation, self.baseline_evaluations)

    def _tested(
        self,
        result: TrainingResult,
        ranks: SingleProcess,
        other_screen: PerturbationEmbedding | None,
        clock: PhaseClock,
        test_interactions: Callable[[], dict | None] | None,
    ) -> dict:
        """The test scores of ``result`` beside the baselines, with the run report's
        interaction check when ``test_interactions`` is given; an empty report without a
        test set."""
        if result.test_result is None:
            if ranks.is_main:
                logger.info("no test set (split %r): training done", self.pert_data.split)
            return {}
        report = self.score_test(result.test_result, ranks, other_screen, clock)
        if test_interactions is not None:  # for the run report; interaction_agreement() gives them on demand
            with clock.phase("interactions"):
                interactions = test_interactions()
            if interactions is not None:
                report["interactions"] = interactions
        return report

    def _save(
        self,
        report: dict,
        options: TrainingOptions,
        best_epoch: int,
        ranks: SingleProcess,
        clock: PhaseClock,
        save: Callable[[str], None],
    ) -> None:
        """The model and the run report in ``options.save_path`` (its pictures where
        ``options.report_pictures``), by the main rank; every rank waits."""
        save_path = str(options.save_path)
        report["model_path"] = save_path
        if ranks.is_main:
            with clock.phase("report"):
                save(save_path)
                logger.info("model of epoch %d saved to %s", best_epoch, save_path)
                drawn = options.report_pictures
                page = write_run_report(save_path, report, self.examples() if drawn else [], clock, drawn)
            logger.info("run report: %s", page)
        ranks.barrier()

    def test(
        self, best_network: nn.Module, test_loader, ranks: SingleProcess = SINGLE_PROCESS, linear_baseline_screen=None
    ) -> TrainedModel:
        """``best_network`` and the baselines scored on ``test_loader`` (``GEARS.test``), with
        subgroups for the simulation split; the main rank logs each metric beside the
        baselines with its verdict. In a distributed run every rank scores its share of the
        cells and ``ranks`` merges them."""
        other_screen = self.other_screen(linear_baseline_screen)
        result = evaluate(
            best_network,
            test_loader,
            self.new_accumulator(),
            self.config["uncertainty"],
            self.device,
            ranks=ranks,
            progress="evaluating test",
        )
        report = self.score_test(result, ranks, other_screen, PhaseClock())
        return TrainedModel(report, self.tracker, self.test_evaluation, self.baseline_evaluations)

    def score_test(
        self,
        result: EvaluationResult,
        ranks: SingleProcess,
        other_screen: PerturbationEmbedding | None,
        clock: PhaseClock,
    ) -> dict:
        """The test summaries of the model's evaluation ``result`` and of the baselines
        (``linear_pretrained`` too with ``other_screen``; ``'model'``, ``'baselines'``), their
        per-perturbation values (``'per_perturbation'``), each method's spread of predicted
        changes (``'prediction_spread'``) and the verdicts with their intervals
        (``'verdicts'``: ``verdicts.verdict_records``), timed as the phases ``test`` and
        ``baselines`` of ``clock``; the evaluations are kept for the report's pictures."""
        with clock.phase("test"):
            context = MetricContext.from_pert_data(self.pert_data, result.conditions, ranks)
            subgroups = self._test_subgroups()
            model_summary, model_conditions = score(result, context, subgroups)
            self.test_evaluation = result
        with clock.phase("baselines"):
            self.baseline_evaluations = baseline_results(self.pert_data, result, other_screen)
            scored = {name: score(res, context, subgroups) for name, res in self.baseline_evaluations.items()}
            report: dict[str, Any] = {
                "model": model_summary,
                "baselines": {name: summary for name, (summary, _) in scored.items()},
                "per_perturbation": per_perturbation_record(
                    result.conditions,
                    subgroups,
                    {GEARS: model_conditions, **{name: per for name, (_, per) in scored.items()}},
                ),
                "prediction_spread": prediction_spreads(result, self.baseline_evaluations),
            }
            verdicts = compare(report)
            report["verdicts"] = verdict_records(verdicts)
        if ranks.is_main:
            logger.info(
                "test set, best model vs baselines:\n%s\n%s",
                verdict_table(summary_verdicts(verdicts, model_summary)),
                "\n".join([spread_line(report["prediction_spread"]), *spread_warnings(report["prediction_spread"])]),
            )
        if self.tracker:
            self.tracker.log(model_summary)
        return report

    def examples(self) -> list[dict]:
        """The test conditions the report's predictions picture shows (none without a test set)."""
        if self.test_evaluation is None:
            return []
        return prediction_examples(
            self.test_evaluation,
            self.baseline_evaluations,
            self.pert_data.cells,
            list(self.pert_data.gene_names),
            self.pert_data.cells.control_mean().numpy(),
            self._test_subgroups(),
        )

    def _test_subgroups(self):
        subgroup = self.pert_data.subgroup
        return subgroup["test_subgroup"] if subgroup else None


def prediction_spreads(result: EvaluationResult, baselines: dict[str, EvaluationResult]) -> dict[str, float]:
    """The spread ratio (``evaluation.prediction_spread``) of the model's and each baseline's
    predictions over the test perturbations (control left out)."""
    rows = [index for index, condition in enumerate(result.conditions) if condition != "ctrl"]
    return {
        name: spread_ratio(evaluation.pred_mean[rows], evaluation.truth_mean[rows])
        for name, evaluation in {GEARS: result, **baselines}.items()
    }
