"""``GEARS``: the single-process API of the published package (model_initialize, train,
predict, GI_predict, plot_perturbation, save_model, load_pretrained, uncertainty mode).

The class is a thin front that keeps the state a user sees (the data, the options, the
network, the best model, the history, the last test scores) and hands explicit inputs to
the parts that do the work: the network is ``model.network.GEARSModel`` with options
``model.model_options.ModelOptions``, training is ``training.recipe.TrainingRecipe`` (the code
every rank of a distributed run runs, through ``train_with``), scoring is
``evaluation.scoring.score``, predictions come from ``inference``, and saved models are the
published format (``model.model_folder``).
"""

from __future__ import annotations

import contextlib
from typing import TypeVar

import numpy as np
import pandas as pd
import torch

from gears_ddp._logging import get_logger
from gears_ddp._options import signature_with
from gears_ddp.evaluation.metrics import EvaluationAccumulator, EvaluationResult
from gears_ddp.inference.model_queries import NO_MODEL, ModelQueries, SavedPredictions
from gears_ddp.inference.pair_screen_job import PairScreenJob, model_record, run_pair_screen, score_chunks_here
from gears_ddp.inference.pair_screen_options import PAIR_SCREEN_CHUNK_PAIRS, PairScreenOptions
from gears_ddp.inference.prediction import EXACT_CHANGE, PREDICTION_CELLS, ChangePredictor
from gears_ddp.inference.saved_predictions import forget_own
from gears_ddp.inference.trained_split import loaded_trained_split, say_if_trained_on_another_split
from gears_ddp.interactions.calls import pair_scores
from gears_ddp.interactions.observed import observed_interactions
from gears_ddp.interactions.pair_tables import score_gene_positions, trained_conditions
from gears_ddp.interactions.scores import scoring_device
from gears_ddp.model.losses import LossContext
from gears_ddp.model.model_folder import (
    GRAPH_KEYS,
    load_weights,
    model_config,
    model_from_config,
    save_model_folder,
    saved_model_options,
    weights_origin,
)
from gears_ddp.model.model_options import ModelOptions
from gears_ddp.model.network import GEARSModel
from gears_ddp.runtime.devices import checked_device
from gears_ddp.runtime.phase_clock import PhaseClock
from gears_ddp.runtime.ranks import SINGLE_PROCESS, SingleProcess
from gears_ddp.training.recipe import TrainingResult
from gears_ddp.training.save_folder import held_save_path
from gears_ddp.training.tracking import start_wandb
from gears_ddp.training.trainer import READ_FROM_OPTIONS, TrainedModel, Trainer, loaders_for
from gears_ddp.training.training_options import TrainingOptions

logger = get_logger(__name__)


T = TypeVar("T")


def _built(value: T | None) -> T:
    """``value``, an attribute that ``model_initialize`` sets; a RuntimeError before it."""
    if value is None:
        raise RuntimeError(NO_MODEL)
    return value


class GEARS:
    """Train and use GEARS on a ``PertData`` that has a split and loaders.

    ``device``: where the model runs ('cpu', 'cuda', 'cuda:1', ..., 'mps' for Apple silicon's
    GPU, or 'auto': CUDA, else MPS, else the CPU), checked against this machine; a
    ``torch.device`` is taken as already resolved (a distributed rank's). ``weight_bias_track``
    logs to Weights & Biases (the optional ``wandb`` package).
    """

    def __init__(
        self,
        pert_data,
        device: str | torch.device = "cpu",
        weight_bias_track: bool = False,
        proj_name: str = "GEARS",
        exp_name: str = "GEARS",
    ):
        if pert_data.cells is None or pert_data.set2conditions is None or pert_data.dataloader is None:
            raise ValueError(
                "GEARS needs loaded data with a split and loaders: call pert_data.load(...) or "
                "new_data_process(...), then prepare_split(...) and get_dataloader(...)"
            )
        self.pert_data = pert_data
        # a torch.device comes resolved (a rank's, from its launcher); a name is checked here, once
        self.device = device if isinstance(device, torch.device) else checked_device(device)
        self.wandb = start_wandb(proj_name, exp_name) if weight_bias_track else None
        self.dataloader = pert_data.dataloader
        self.node_map, self.node_map_pert = pert_data.node_map, pert_data.node_map_pert
        self.gene_list = list(pert_data.gene_names)
        self.pert_list = list(pert_data.pert_names)
        self.num_genes, self.num_perts = len(self.gene_list), len(self.pert_list)
        self.split, self.subgroup = pert_data.split, pert_data.subgroup
        self.ctrl_expression = pert_data.cells.control_mean().to(self.device)
        self.config: dict | None = None
        self.model: GEARSModel | None = None
        self.best_model: GEARSModel | None = None
        self.saved_pred: dict[str, np.ndarray] = {}  # the published cache (inference.saved_predictions)
        self.saved_logvar_sum: dict[str, float] = {}
        self._own_predictions: dict[str, np.ndarray] = {}  # the entries of saved_pred this object's predict wrote
        self.history: list[dict] = []
        self.test_result: EvaluationResult | None = None  # the last test evaluation, and the baselines'
        self.test_baseline_results: dict = {}
        self.weights_from: str | None = None  # 'training' or the model folder the weights were loaded from
        self.trained_split: dict | None = None  # a loaded run's split_config (inference.trained_split)

    @staticmethod
    def tunable_parameters() -> dict[str, str]:
        """The model options, each with what it means and its default."""
        return ModelOptions.tunable_parameters()

    def model_initialize(
        self, G_go=None, G_go_weight=None, G_coexpress=None, G_coexpress_weight=None, **options
    ) -> None:
        """Build the gene graphs (unless given) and the network. ``options`` are the
        published model options (``ModelOptions``: ``hidden_size``, ``uncertainty``, ...;
        ``tunable_parameters()`` lists them), checked before anything is built."""
        self.build_model(
            ModelOptions.from_dict(options, "model_initialize"), G_go, G_go_weight, G_coexpress, G_coexpress_weight
        )

    def build_model(
        self, options: ModelOptions, G_go=None, G_go_weight=None, G_coexpress=None, G_coexpress_weight=None
    ) -> None:
        """``model_initialize`` with ``options`` checked before (a distributed rank's, which its
        launcher checked once)."""
        graphs = {
            "G_go": G_go,
            "G_go_weight": G_go_weight,
            "G_coexpress": G_coexpress,
            "G_coexpress_weight": G_coexpress_weight,
        }
        self.config = model_config(options.as_dict(), self.pert_data, self.device, graphs)
        self.model = self.best_model = model_from_config(self.config).to(self.device)
        forget_own(self.saved_pred, self.saved_logvar_sum, self._own_predictions)
        if self.wandb:
            self.wandb.config.update({k: v for k, v in self.config.items() if k not in GRAPH_KEYS})

    def _require_model(self) -> None:
        if self.config is None:
            raise RuntimeError(NO_MODEL)

    def _queries(self) -> ModelQueries:
        """The best model's answers to queries (``inference.model_queries``), from what this
        object holds now."""
        saved = SavedPredictions(self.saved_pred, self.saved_logvar_sum, self._own_predictions)
        return ModelQueries(self.best_model, self.device, self.pert_data, saved, self.config, self.weights_from)

    # ------------------------------------------------------------------ training
    def _trainer(self) -> Trainer:
        """The owner of this model's training, scoring and run report (``training.trainer``)."""
        return Trainer(self.pert_data, _built(self.config), self.device, self.wandb)

    def loss_context(self) -> LossContext:
        """The loss's per-condition gene sets and control mean, on the model's device."""
        return self._trainer().loss_context()

    @property
    def adata(self):
        """The dataset as an AnnData (``PertData.adata``; built when first asked for)."""
        return self.pert_data.adata

    def new_accumulator(self) -> EvaluationAccumulator:
        """An empty per-condition accumulator for one evaluation pass."""
        return self._trainer().new_accumulator()

    def train(self, **options) -> dict:
        """Train, keep the model with the lowest val ``mse_de`` (``best_model``), score it and
        the baselines on test, and return the report (test summaries, ``'best_epoch'``,
        ``'history'``, ``'timing'``; with ``save_path``, the run folder's: ``Trainer.train``).
        The options are ``TrainingOptions``, ``train_multi_gpu``'s ``args`` under the same
        names (docs/options.md); loader options given here rebuild the loaders with them
        (``trainer.loaders_for``). A ``save_path`` is held by this call while it trains
        (``training.save_folder.held_save_path``)."""
        clock = PhaseClock()
        with clock.phase("set-up"):
            checked: TrainingOptions = TrainingOptions.from_dict(options, where="train")  # the options' one check
            self._require_model()
        with (
            contextlib.nullcontext()
            if checked.save_path is None
            else held_save_path(checked.save_path, "GEARS.train", checked.resume_from, checked.overwrite_save_path)
        ):
            with clock.phase("set-up"):
                self.dataloader = loaders_for(self.pert_data, checked, self.device)
            # the loaders' own values, where the options left them as built: its checkpoints record them
            return self.train_with(checked.with_loader_options(self.pert_data.loader_options), SINGLE_PROCESS, clock)

    def train_with(
        self,
        options: TrainingOptions,
        ranks: SingleProcess = SINGLE_PROCESS,
        clock: PhaseClock | None = None,
        resume=READ_FROM_OPTIONS,
    ) -> dict:
        """The training every process runs, alone (``train``) or as a rank of ``ranks``, on
        ``options`` checked by whoever started it, continuing from the checkpoint ``resume``
        it read (``Trainer.train``): ``train``'s report, with ``'world_size'`` and
        ``'parameter_digests'``."""
        self._require_model()
        trained = self._trainer().train(
            _built(self.model),
            self.dataloader,
            options,
            ranks,
            PhaseClock() if clock is None else clock,
            resume,
            self._keep,
            self._test_interactions,
            self.save_model,
        )
        return self._kept_scores(trained)

    def _keep(self, result: TrainingResult) -> None:
        """Keep what training produced: the best model and the history."""
        self.best_model, self.history = result.best_network, result.history
        if result.history:  # train(epochs=0) leaves the weights, and where they came from, as they were
            self.weights_from, self.trained_split = "training", None  # trained on this data's split
        forget_own(self.saved_pred, self.saved_logvar_sum, self._own_predictions)

    def _kept_scores(self, trained: TrainedModel) -> dict:
        """Keep the tracker and the test evaluations (for the report's pictures); the report."""
        self.wandb = trained.tracker
        if trained.test_evaluation is not None:
            self.test_result, self.test_baseline_results = trained.test_evaluation, trained.baseline_evaluations
        return trained.report

    def test(self, ranks: SingleProcess = SINGLE_PROCESS, linear_baseline_screen=None) -> dict:
        """Score the best model and the baselines on the test set, each rank its share
        (``Trainer.test``), and keep the evaluations (``test_result``,
        ``test_baseline_results``) for the report's pictures. ``linear_baseline_screen``: the
        screen whose PCA places the ``linear_pretrained`` baseline's perturbations."""
        self._require_model()
        say_if_trained_on_another_split(self.weights_from, self.trained_split, self.pert_data, "the test set")
        return self._kept_scores(
            self._trainer().test(_built(self.best_model), self.dataloader["test_loader"], ranks, linear_baseline_screen)
        )

    def _test_interactions(self) -> dict | None:
        """The run report's interaction check (``ModelQueries.test_interactions``), by the best model then."""
        return self._queries().test_interactions()

    # ------------------------------------------------------------------ using a model
    def predict(
        self,
        pert_list,
        return_type: str = "dict",
        seed: int = 0,
        cells_per_perturbation: int = PREDICTION_CELLS,
        all_samples: bool = False,
    ):
        """Mean predicted expression for each query (a list of 1 or 2 genes), over
        ``cells_per_perturbation`` (300, as the published GEARS) control cells drawn with
        ``seed``: ``return_type`` ``'dict'`` (``{'A_B': array}``; with uncertainty also
        ``{'A_B': exp(-mean logvar)}``), ``'dataframe'``, ``'anndata'`` or ``'cell-eval'``
        (per-cell); ``all_samples=True``: each query's predicted cells. Kept in ``saved_pred``
        and ``saved_logvar_sum`` as published; an entry handed in there answers its query for
        ``'dict'`` and ``'dataframe'``, weights or none (``inference.model_queries.
        ModelQueries.predict`` says each in full)."""
        return self._queries().predict(pert_list, return_type, seed, cells_per_perturbation, all_samples)

    def predict_split(
        self,
        split: str = "test",
        clip_at_zero: bool = True,
        cells_per_perturbation: int | None = None,
        seed: int = 0,
        baseline: str | None = None,
        linear_baseline_screen=None,
    ):
        """Predicted and real AnnData of ``split`` in cell-eval's layout: a predicted cell for
        each of its cells, or ``cells_per_perturbation`` per perturbation drawn with ``seed``;
        ``baseline``: that baseline's cells (``'linear_pretrained'`` with
        ``linear_baseline_screen``) instead (``ModelQueries.split_predictions``)."""
        say_if_trained_on_another_split(self.weights_from, self.trained_split, self.pert_data, f"the {split} set")
        other_screen = None if baseline is None else self._trainer().other_screen(linear_baseline_screen)
        return self._queries().split_predictions(
            self.dataloader, split, clip_at_zero, cells_per_perturbation, seed, baseline, other_screen
        )

    def provenance(self) -> dict:
        """What produces this object's predictions, for their ``uns['gears_ddp']``: the
        library version, the dataset, where the weights came from and the model options
        (graph tensors left out)."""
        return self._queries().provenance

    def perturbation_effects(self, sets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The best model's predicted change from control (K x G) of each perturbation set
        (K x 2 vocabulary indices, -1 padded), and its log-variance in uncertainty mode (else
        None), on the model's device: a cell's prediction is its control expression plus it."""
        return self._queries().effects(sets)

    def GI_predict(self, combo, GI_genes_file=None, change: str = EXACT_CHANGE, seed: int = 0) -> dict:
        """Genetic-interaction scores of the combination A+B from the changes over control of
        A, B and A+B (``interactions.calls.pair_scores``; the dict starts with ``'ts'``, as
        published), on the genes of ``GI_genes_file`` if given. ``change``: ``'exact'`` or the
        published ``'drawn-cells-minus-control-mean'`` (docs/screens.md); entries handed in to
        ``saved_pred`` for A, B and A_B are scored instead (``ModelQueries.pair_changes``)."""
        changes = self._queries().pair_changes(combo, change, seed)
        return pair_scores(changes, score_gene_positions(self.gene_list, GI_genes_file))

    def observed_interactions(self, split: str | None = None, GI_genes_file=None) -> pd.DataFrame:
        """The observed two-gene conditions (of the data, or of ``split``: 'train', 'val' or
        'test') whose singles were observed too, scored from their observed changes as a
        screen scores pairs, one row per pair (``interactions.observed``); no model needed."""
        return observed_interactions(self.pert_data, split, GI_genes_file, scoring_device(self.device))

    def interaction_agreement(self, split: str | None = "test", GI_genes_file=None) -> dict:
        """The observed pairs of ``split`` (``observed_interactions``) and the same pairs
        scored from the model's predicted changes: ``{'observed': table, 'predicted': table,
        'agreement': ...}`` (per score and per interaction type: ``interactions.agreement.
        compare_calls``)."""
        return self._queries().split_agreement(split, GI_genes_file)

    def change_predictor(self, change: str = EXACT_CHANGE, seed: int = 0) -> ChangePredictor:
        """The best model's predicted changes over control, exact or with the published
        sampling noise (``inference.prediction.ChangePredictor``)."""
        return self._queries().change_predictor(change, seed)

    def screen(
        self,
        genes,
        GI_genes_file=None,
        change: str = EXACT_CHANGE,
        seed: int = 0,
        out=None,
        overwrite: bool = False,
        chunk_pairs: int = PAIR_SCREEN_CHUNK_PAIRS,
    ) -> pd.DataFrame:
        """An in-silico pair screen in this process: every pair of ``genes`` scored as
        ``GI_predict`` scores one, a row per pair; ``out`` (.csv): written with its record,
        resumable from finished chunks of ``chunk_pairs`` pairs, another screen there refused
        unless ``overwrite`` (``inference.pair_screen_job.run_pair_screen``; docs/screens.md).
        ``seed``: of the drawn control cells, with the drawn-cells ``change`` only. The
        options are ``inference.pair_screen_options.PairScreenOptions``."""
        given = {"GI_genes_file": GI_genes_file, "change": change, "seeds": [seed], "chunk_pairs": chunk_pairs}
        options = PairScreenOptions.from_dict({**given, "out": out, "overwrite": overwrite}, "screen")
        return run_pair_screen(self.pair_screen_job(genes, options), out, overwrite, score_chunks_here)

    def pair_screen_job(self, genes, options: PairScreenOptions | None = None) -> PairScreenJob:
        """What a pair screen of ``genes`` with ``options`` (checked before) computes: the genes
        (unknown ones named all at once), the pairs, the predictor (the first of
        ``options.seeds``), the genes scores are taken on, and the Theil-Sen subsets."""
        options = options or PairScreenOptions()
        predictor = self.change_predictor(options.change, options.seed)
        return PairScreenJob.build(
            genes,
            self.node_map_pert,
            self.pert_data.gene2go,
            self.gene_list,
            predictor,
            options.GI_genes_file,
            trained_conditions(self.pert_data.set2conditions),
            model_record(self.best_model, self.weights_from),
            options.chunk_pairs,
        )

    def pair_screen_jobs(self, genes, options: PairScreenOptions) -> list[PairScreenJob]:
        """One ``pair_screen_job`` per seed of ``options.seeds`` (one with the exact change),
        sharing the network, the control cells and the Theil-Sen subsets."""
        job = self.pair_screen_job(genes, options)
        return [job.with_draw_seed(seed) for seed in options.seeds]

    def plot_perturbation(self, query: str, save_file=None):
        """Box plots of the true change over control at the condition's top-20 non-dropout DE
        genes, with the predicted change marked; returns the matplotlib figure."""
        from gears_ddp.inference.figures import plot_perturbation

        control = self.ctrl_expression.cpu().numpy()
        return plot_perturbation(self.pert_data, query, control, self._queries().mean_expression, save_file)

    # ------------------------------------------------------------------ checkpoints
    def save_model(self, path) -> None:
        """Write ``config.pkl``, ``model.pt`` (best model) and ``vocabulary.json`` atomically."""
        self._require_model()
        save_model_folder(
            path,
            _built(self.config),
            _built(self.best_model).state_dict(),
            self.gene_list,
            self.pert_list,
            trained=self.weights_from is not None,
        )

    def load_pretrained(self, path) -> None:
        """Load a model folder written by ``save_model``, by a distributed run or by the
        published GEARS (a ``module.`` prefix is stripped)."""
        self.model_initialize(**saved_model_options(path, ModelOptions.names(), self.gene_list, self.pert_list))
        load_weights(_built(self.model), path)
        self.best_model = self.model
        self.weights_from = weights_origin(path)  # None: random initial weights, saved as they were
        self.trained_split = loaded_trained_split(path, self.pert_data)


# the signatures inspect.signature (help(), editors) reads; typeshed declares no function __signature__
GEARS.model_initialize.__signature__ = signature_with(GEARS.model_initialize, ModelOptions)  # type: ignore[attr-defined]
GEARS.train.__signature__ = signature_with(GEARS.train, TrainingOptions)  # type: ignore[attr-defined]
