"""``GEARS``: the single-process API of the published package (model_initialize, train,
predict, GI_predict, plot_perturbation, save_model, load_pretrained, uncertainty mode).

The class is a thin front that keeps the state a user sees (the data, the options, the
network, the best model, the history, the last test scores) and hands explicit inputs to
the parts that do the work: the network is ``model.network.GEARSModel`` with options
``model.options.ModelOptions``, training is ``training.recipe.TrainingRecipe`` (the code
every rank of a distributed run runs, through ``train_with``), scoring is
``evaluation.scoring.score``, predictions come from ``inference``, and saved models are the
published format (``model.folder``).
"""
from __future__ import annotations


import numpy as np
import pandas as pd
import torch

from gears_ddp._logging import get_logger
from gears_ddp._options import signature_with
from gears_ddp._version import __version__
from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.evaluation.baselines import baseline_effects
from gears_ddp.evaluation.linear_baseline import PerturbationEmbedding
from gears_ddp.evaluation.metrics import EvaluationAccumulator
from gears_ddp.inference.observed_interactions import compare_calls, interaction_records, observed_interactions, \
    predicted_interactions
from gears_ddp.inference.prediction import EXACT_CHANGE, PREDICTION_CELLS, ChangePredictor, drawn_control_cells, \
    query_keys, query_sets, set_effects
from gears_ddp.inference.saved_predictions import forget_own, handed_in, saved_expression
from gears_ddp.inference.screen import SCREEN_CHUNK_PAIRS, ScreenJob, model_record, run_screen, \
    score_chunks_here, score_gene_positions
from gears_ddp.model.folder import GRAPH_KEYS, check_vocabulary, load_weights, model_from_config, read_config, \
    save_model_folder
from gears_ddp.model.losses import LossContext
from gears_ddp.model.network import GEARSModel
from gears_ddp.model.options import ModelOptions
from gears_ddp.runtime.devices import checked_device
from gears_ddp.runtime.phase_clock import PhaseClock
from gears_ddp.runtime.ranks import SINGLE_PROCESS, SingleProcess
from gears_ddp.training.options import TrainingOptions, check_save_path
from gears_ddp.training.recipe import TrainingResult
from gears_ddp.training.trainer import READ_FROM_OPTIONS, TrainedModel, Trainer, loaders_for
from gears_ddp.training.tracking import start_wandb

logger = get_logger(__name__)


class GEARS:
    """Train and use GEARS on a ``PertData`` that has a split and loaders.

    ``device``: where the model runs ('cpu', 'cuda', 'cuda:1', ..., 'mps' for Apple silicon's
    GPU, or 'auto': CUDA, else MPS, else the CPU), checked against this machine; a
    ``torch.device`` is taken as already resolved (a distributed rank's). ``weight_bias_track``
    logs to Weights & Biases (the optional ``wandb`` package).
    """

    def __init__(self, pert_data, device: str = "cpu", weight_bias_track: bool = False, proj_name: str = "GEARS",
                 exp_name: str = "GEARS"):
        if pert_data.cells is None or pert_data.set2conditions is None or pert_data.dataloader is None:
            raise ValueError("GEARS needs loaded data with a split and loaders: call pert_data.load(...) or "
                             "new_data_process(...), then prepare_split(...) and get_dataloader(...)")
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
        self.test_result = None             # the last test evaluation (EvaluationResult), and the baselines'
        self.test_baseline_results: dict = {}
        self.weights_from: str | None = None  # 'training' or the model folder the weights were loaded from

    @staticmethod
    def tunable_parameters() -> dict[str, str]:
        """The model options, each with what it means and its default."""
        defaults = ModelOptions.defaults()
        return {name: f"{meaning}, default {defaults[name]!r}" for name, meaning in ModelOptions.help().items()}

    def model_initialize(self, G_go=None, G_go_weight=None, G_coexpress=None, G_coexpress_weight=None,
                         **options) -> None:
        """Build the gene graphs (unless given) and the network. ``options`` are the
        published model options (``ModelOptions``: ``hidden_size``, ``uncertainty``, ...;
        ``tunable_parameters()`` lists them), checked before anything is built."""
        self.build_model(ModelOptions.from_dict(options, "model_initialize"), G_go, G_go_weight, G_coexpress,
                         G_coexpress_weight)

    def build_model(self, options: ModelOptions, G_go=None, G_go_weight=None, G_coexpress=None,
                    G_coexpress_weight=None) -> None:
        """``model_initialize`` with ``options`` checked before (a distributed rank's, which its
        launcher checked once)."""
        if G_coexpress is None:
            graph = self.pert_data.coexpression_graph(options.coexpress_threshold,
                                                      options.num_similar_genes_co_express_graph)
            G_coexpress, G_coexpress_weight = graph.edge_index, graph.edge_weight
        if G_go is None:
            graph = self.pert_data.go_graph(options.num_similar_genes_go_graph)
            G_go, G_go_weight = graph.edge_index, graph.edge_weight
        self.config = {**options.as_dict(), "G_go": G_go, "G_go_weight": G_go_weight, "G_coexpress": G_coexpress,
                       "G_coexpress_weight": G_coexpress_weight, "device": str(self.device),
                       "num_genes": self.num_genes, "num_perts": self.num_perts}
        self.model = model_from_config(self.config).to(self.device)
        self.best_model = self.model
        forget_own(self.saved_pred, self.saved_logvar_sum, self._own_predictions)
        if self.wandb:
            self.wandb.config.update({k: v for k, v in self.config.items() if not k.startswith("G_")})

    def _require_model(self) -> None:
        if self.config is None:
            raise RuntimeError("no model yet: call model_initialize(...) or load_pretrained(path) first")

    def _require_weights(self) -> None:
        """Predictions need trained weights, not the random initial ones."""
        self._require_model()
        if self.weights_from is None and not self.config["no_perturb"]:  # no_perturb predicts control as it is
            raise RuntimeError("the model still has its random initial weights: train it (train(...)) or load "
                               "trained weights (load_pretrained(path)) before predicting")

    # ------------------------------------------------------------------ training
    def _trainer(self) -> Trainer:
        """The owner of this model's training, scoring and run report (``training.trainer``)."""
        return Trainer(self.pert_data, self.config, self.device, self.wandb)

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
        the baselines on test, and return the report: ``'model'`` and ``'baselines'`` test
        summaries, ``'best_epoch'``, ``'history'``, ``'timing'`` (the wall seconds of each
        phase: set-up, epochs, test, baselines and, with a run report, interactions and
        report) and, with ``save_path``, ``'model_path'`` and ``'interactions'`` (the run
        report's check of the observed test combinations, which ``interaction_agreement()``
        gives on demand).

        The options are ``TrainingOptions`` (``epochs``, ``lr``, ``amp``, ...), which are
        ``train_multi_gpu``'s ``args`` under the same names (docs/options.md). ``seed``,
        ``batch_size``, ``test_batch_size``, ``num_workers`` and ``resample_controls``
        default to what ``pert_data.get_dataloader`` was given; a value here rebuilds the
        loaders with it (as does a CUDA device, whose loaders gather batches into pinned
        memory).
        """
        clock = PhaseClock()
        with clock.phase("set-up"):
            options = TrainingOptions.from_dict(options, where="train")  # the options' one check
            self._require_model()
            if options.save_path is not None:
                check_save_path(options.save_path)
            self.dataloader = loaders_for(self.pert_data, options, self.device)
        return self.train_with(options, SINGLE_PROCESS, clock)

    def train_with(self, options: TrainingOptions, ranks: SingleProcess = SINGLE_PROCESS,
                   clock: PhaseClock | None = None, resume=READ_FROM_OPTIONS) -> dict:
        """The training every process runs, one alone (``train``) or each rank of a
        distributed run (``ranks``): the recipe on this object's network and loaders, then
        the best model kept, scored on test beside the baselines, saved with the run report
        by the main rank when ``options.save_path`` is set. Returns ``train``'s report with
        ``'world_size'``, ``'parameter_digests'`` (each rank's final weights) and
        ``'timing'``: the wall seconds of each phase of the run on this rank (``clock``,
        which may hold phases timed before, such as a rank's start-up), also the last line
        of the main rank's log. ``options`` come checked, and their ``save_path`` checked, by
        whoever started the run; ``resume``: the checkpoint it read once to continue from
        (``training.trainer``; by default read here from ``options.resume_from``)."""
        self._require_model()
        trained = self._trainer().train(self.model, self.dataloader, options, ranks,
                                        PhaseClock() if clock is None else clock, resume, self._keep,
                                        self._test_interactions, self.save_model)
        return self._kept_scores(trained)

    def _keep(self, result: TrainingResult) -> None:
        """Keep what training produced: the best model and the history."""
        self.best_model, self.history = result.best_network, result.history
        if result.history:  # train(epochs=0) leaves the weights, and where they came from, as they were
            self.weights_from = "training"
        forget_own(self.saved_pred, self.saved_logvar_sum, self._own_predictions)

    def _kept_scores(self, trained: TrainedModel) -> dict:
        """Keep the tracker and the test evaluations (for the report's pictures); the report."""
        self.wandb = trained.tracker
        if trained.test_evaluation is not None:
            self.test_result, self.test_baseline_results = trained.test_evaluation, trained.baseline_evaluations
        return trained.report

    def test(self, ranks: SingleProcess = SINGLE_PROCESS, linear_baseline_screen=None) -> dict:
        """Score the best model and the baselines on the test set (with subgroups for the
        simulation split); the main rank logs each metric beside the baselines with its
        verdict. In a distributed run every rank scores its share of the cells and ``ranks``
        merges them. Keeps the evaluation results of the model and the baselines
        (``test_result``, ``test_baseline_results``) for the report's pictures.
        ``linear_baseline_screen``: the training option of that name (another screen whose PCA
        places the perturbations of the ``linear_pretrained`` baseline)."""
        self._require_model()
        return self._kept_scores(self._trainer().test(self.best_model, self.dataloader["test_loader"], ranks,
                                                      linear_baseline_screen))

    def _other_screen(self, path) -> PerturbationEmbedding | None:
        """The perturbations of the screen at ``path`` placed by its PCA (``Trainer.other_screen``)."""
        return self._trainer().other_screen(path)

    def _test_interactions(self) -> dict | None:
        """For the run report: the test combinations whose singles were observed, scored from
        their observed and from the best model's predicted changes, and how far the calls
        agree (``interaction_agreement``); None without such combinations. Scored on the
        model's GPU, if it has one."""
        observed = observed_interactions(self.pert_data, "test", device=self._scores_device())
        if not len(observed):
            return None
        check = self._interaction_agreement(observed)
        return {"set": "test", "agreement": check["agreement"],
                "pairs": [{"pair": pair, "observed": seen, "predicted": called}
                          for pair, seen, called in zip(observed["pair"], interaction_records(observed),
                                                        interaction_records(check["predicted"]))]}

    # ------------------------------------------------------------------ using a model
    def predict(self, pert_list, return_type: str = "dict", seed: int = 0,
                cells_per_perturbation: int = PREDICTION_CELLS, all_samples: bool = False):
        """Mean predicted expression for each query (a list of 1 or 2 genes), over
        ``cells_per_perturbation`` (300, as the published GEARS) control cells drawn with
        ``seed`` (with replacement), each with the query's perturbation applied.

        ``return_type``:

        - ``'dict'``: the reference's ``{'A_B': array}``; with uncertainty also
          ``{'A_B': exp(-mean logvar)}``;
        - ``'dataframe'``: queries (``'A_B'``) x gene names;
        - ``'anndata'``: one row per query named by its condition as the data writes it
          (``'A+ctrl'``, ``'A+B'``), the queried genes in ``obs`` (and ``uncertainty``), the
          genes as ``var``, provenance in ``uns['gears_ddp']``
          (``cell_eval_export.mean_predictions``);
        - ``'cell-eval'``: per-cell predictions in the layout of Arc Institute's cell-eval:
          the drawn control cells each with each query's predicted change (clipped at 0), so
          ``cells_per_perturbation`` cells per query, then the same cells as control
          (``cell_eval_export.cell_predictions``).

        Every prediction is kept in ``saved_pred`` (and its uncertainty in
        ``saved_logvar_sum``) under its ``'A_B'`` key, as published. For ``'dict'`` and
        ``'dataframe'`` a query whose entry was handed in there (written by you, or copied
        from another ``GEARS``; with uncertainty, its ``saved_logvar_sum`` entry too) is
        answered from it, weights or none (``inference.saved_predictions``); the others need
        trained weights.

        ``all_samples=True`` (an option of the paper's scripts, with ``'dict'``): each query's
        predicted cells, ``{'A_B': (cells_per_perturbation x genes)}``, instead of their mean;
        they are not kept in ``saved_pred``.
        """
        return_types = ("dict", "dataframe", "anndata", "cell-eval")
        if return_type not in return_types:
            raise ValueError(f"return_type must be one of {return_types}, got {return_type!r}")
        if all_samples and return_type != "dict":
            raise ValueError("all_samples=True gives each query's predicted cells as arrays in a dict: it goes with "
                             "return_type='dict' (return_type='cell-eval' gives them as an AnnData)")
        sets = query_sets(pert_list, self.node_map_pert)
        pert_list = [list(query) for query in pert_list]
        keys = query_keys(pert_list)
        uncertain = self.config is not None and self.config["uncertainty"]
        answers_from_saved = return_type in ("dict", "dataframe") and not all_samples
        saved = handed_in(self.saved_pred, self._own_predictions, keys) if answers_from_saved else {}
        saved = {key: value for key, value in saved.items() if not uncertain or key in self.saved_logvar_sum}
        prediction = np.zeros((len(keys), self.num_genes), dtype=np.float32)
        uncertainty = np.zeros(len(keys)) if uncertain else None
        computed = [row for row, key in enumerate(keys) if key not in saved]
        if computed:
            self._require_weights()
            picked = drawn_control_cells(self.pert_data.cells, seed, cells_per_perturbation)
            effect, logvar = self.perturbation_effects(sets[computed])
            prediction[computed] = (effect + picked.mean(0).to(self.device)).cpu().numpy()
            if uncertain:
                uncertainty[computed] = torch.exp(-logvar.mean(1)).cpu().numpy()
        if all_samples:
            cells = {key: (picked.to(self.device) + effect[row]).cpu().numpy() for row, key in enumerate(keys)}
            return cells if uncertainty is None else (cells, dict(zip(keys, uncertainty.tolist())))
        for row, key in enumerate(keys):
            if key in saved:
                prediction[row] = saved_expression(saved, [key], self.num_genes)[0]
                if uncertain:
                    uncertainty[row] = self.saved_logvar_sum[key]
            elif key not in self.saved_pred or self.saved_pred[key] is self._own_predictions.get(key):
                self.saved_pred[key] = self._own_predictions[key] = prediction[row].copy()
                if uncertain:
                    self.saved_logvar_sum[key] = float(uncertainty[row])
        if return_type == "dataframe":
            return pd.DataFrame(prediction, index=keys, columns=self.gene_list)
        if return_type == "anndata":
            from gears_ddp.inference.cell_eval_export import mean_predictions
            return mean_predictions(self.pert_data, self.provenance(), pert_list, prediction, uncertainty, seed,
                                    len(picked))
        if return_type == "cell-eval":
            from gears_ddp.inference.cell_eval_export import cell_predictions
            return cell_predictions(self.pert_data, self.provenance(), pert_list, picked, effect.cpu(), seed)
        predictions = dict(zip(keys, prediction))
        return predictions if uncertainty is None else (predictions, dict(zip(keys, uncertainty.tolist())))

    def predict_split(self, split: str = "test", clip_at_zero: bool = True, cells_per_perturbation: int | None = None,
                      seed: int = 0, baseline: str | None = None, linear_baseline_screen=None):
        """Predicted and real AnnData of the perturbations of ``split`` in cell-eval's layout:
        a predicted cell for every cell of the split, or ``cells_per_perturbation`` cells per
        perturbation from control cells drawn with ``seed``
        (``inference.cell_eval_export.split_predictions``; ``gears-ddp predict --split``).
        ``baseline``: the cells of that baseline (``'linear'``, ...; ``'linear_pretrained'``
        with ``linear_baseline_screen``) instead of the model's, built the same way from its
        predicted changes, so cell-eval scores the two files alike."""
        from gears_ddp.inference.cell_eval_export import split_predictions

        self._require_weights()
        effects, provenance = self.perturbation_effects, self.provenance()
        if baseline is not None:
            effects = baseline_effects(self.pert_data, baseline, self._other_screen(linear_baseline_screen))
            provenance["baseline"] = baseline
        return split_predictions(self.pert_data, self.dataloader, effects, provenance, split, clip_at_zero,
                                 cells_per_perturbation, seed)

    def provenance(self) -> dict:
        """What produces this object's predictions, for their ``uns['gears_ddp']``: the
        library version, the dataset, where the weights came from and the model options
        (graph tensors left out)."""
        self._require_model()
        return {"version": __version__, "dataset": self.pert_data.dataset_name, "weights_from": str(self.weights_from),
                "config": {k: v for k, v in self.config.items() if k not in GRAPH_KEYS}}

    def perturbation_effects(self, sets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The best model's predicted change from control (K x G) of each perturbation set
        (K x 2 perturbation-vocabulary indices, -1 padded), and its log-variance in
        uncertainty mode (else None), on the model's device. In evaluation mode a cell's
        prediction is its control expression plus its set's change (``engine.evaluate``), so
        predictions of any control cells follow from these."""
        self._require_weights()
        return set_effects(self.best_model, sets, self.device)

    def GI_predict(self, combo, GI_genes_file=None, change: str = EXACT_CHANGE, seed: int = 0) -> dict:
        """Genetic-interaction scores of a two-gene combination A+B (``inference.interactions.
        genetic_interaction_scores``) from the predicted changes over control of A, B and A+B,
        optionally on the genes listed in ``GI_genes_file`` only. As published, the dict
        starts with ``'ts'``, the fitted Theil-Sen line (``interactions.TheilSenFit``).

        ``change='exact'`` scores the model's predicted changes; ``'drawn-cells-minus-control-
        mean'`` those of the published ``GI_predict`` (each the mean prediction over 300
        control cells drawn for it with ``seed``, minus the mean of all control cells), whose
        sampling noise moves the scores (docs/screens.md).

        When ``saved_pred`` holds entries handed in for ``'A'``, ``'B'`` and ``'A_B'``
        (written by you, or copied from another ``GEARS``), they are scored instead, minus
        the mean of all control cells, as published, weights or none: another model's
        predictions, or the true mean expression of observed conditions
        (``observed_interactions`` does the latter for every observed pair at once).
        """
        from gears_ddp.inference.interactions import genetic_interaction_scores, with_theil_sen_fit

        if isinstance(combo, str) or len(combo) != 2 or not all(isinstance(gene, str) for gene in combo):
            raise ValueError(f"GI_predict takes two genes, got {combo!r}")
        keys = [combo[0], combo[1], "_".join(combo)]
        saved = handed_in(self.saved_pred, self._own_predictions, keys)
        if len(saved) == len(keys):
            control = self.pert_data.cells.control_mean().double().numpy()
            changes = torch.from_numpy(saved_expression(saved, keys, self.num_genes) - control)
        else:
            sets = query_sets([[combo[0]], [combo[1]], list(combo)], self.node_map_pert)
            try:
                self._require_weights()
            except RuntimeError as err:
                missing = [key for key in keys if key not in saved]
                raise RuntimeError(f"{err}; or hand in the predictions GI_predict scores without weights: "
                                   f"saved_pred needs {missing} beside {sorted(saved)}") from None
            changes = self.change_predictor(change, seed).changes(sets)
        genes = score_gene_positions(self.gene_list, GI_genes_file)
        if genes is not None:
            changes = changes[:, torch.as_tensor(genes, device=changes.device)]
        first, second, double = changes.double().cpu().numpy()
        return with_theil_sen_fit(genetic_interaction_scores(first, second, double))

    def observed_interactions(self, split: str | None = None, GI_genes_file=None) -> pd.DataFrame:
        """The observed two-gene conditions (of the whole dataset, or of ``split``: 'train',
        'val' or 'test') whose singles were observed too, scored from their observed changes
        over control with the scores and interaction types of a screen, one row per pair
        (``inference.observed_interactions``); no model needed. Scored on this object's
        GPU, if it has one."""
        return observed_interactions(self.pert_data, split, GI_genes_file, self._scores_device())

    def interaction_agreement(self, split: str | None = "test", GI_genes_file=None) -> dict:
        """The observed pairs of ``split`` (``observed_interactions``) and the same pairs
        scored from the model's predicted changes: ``{'observed': table, 'predicted':
        table, 'agreement': ...}``, the agreement being, per score, the Pearson correlation
        and mean absolute difference over the pairs and, per interaction type, how many calls
        agree, with the confusion table (``observed_interactions.compare_calls``)."""
        self._require_weights()
        observed = observed_interactions(self.pert_data, split, GI_genes_file, self._scores_device())
        return self._interaction_agreement(observed, GI_genes_file)

    def _scores_device(self) -> torch.device:
        """Where the observed pairs' interaction scores are computed: the model's GPU when it
        is on a CUDA device, else the CPU (the scores are float64, which MPS lacks)."""
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _interaction_agreement(self, observed: pd.DataFrame, GI_genes_file=None) -> dict:
        """``interaction_agreement`` of the ``observed`` pairs (``observed_interactions``), by
        the best model as it is."""
        predictor = ChangePredictor.for_data(self.best_model, self.device, self.pert_data.cells)
        predicted = predicted_interactions(observed, predictor, self.node_map_pert, self.gene_list, GI_genes_file,
                                           self._train_conditions())
        return {"observed": observed, "predicted": predicted, "agreement": compare_calls(observed, predicted)}

    def change_predictor(self, change: str = EXACT_CHANGE, seed: int = 0) -> ChangePredictor:
        """The best model's predicted changes over control, exact or with the published
        sampling noise (``inference.prediction.ChangePredictor``)."""
        self._require_weights()
        return ChangePredictor.for_data(self.best_model, self.device, self.pert_data.cells, change, seed)

    def screen(self, genes, GI_genes_file=None, change: str = EXACT_CHANGE, seed: int = 0, out=None,
               overwrite: bool = False, chunk_pairs: int = SCREEN_CHUNK_PAIRS) -> pd.DataFrame:
        """An in-silico combinatorial screen: every pair of ``genes`` predicted and scored as
        ``GI_predict`` scores one pair, in this process (``gears-ddp screen`` spreads the
        pairs over processes or GPUs). Returns one row per pair (``inference.screen.
        screen_table``): the genes, the scores, whether the pair and its singles were in the
        train set, and the interaction types the scores imply.

        ``out`` (a .csv file): write the table there, with a record of the model, genes and
        options beside it (``.json``); finished chunks of ``chunk_pairs`` pairs are kept in
        ``<out>.partial/`` while it runs, so that a screen interrupted part way continues
        from them when called again. An existing screen of another model, genes or options
        is refused unless ``overwrite``."""
        return run_screen(self.screen_job(genes, GI_genes_file, change, seed, chunk_pairs), out, overwrite,
                          score_chunks_here)

    def screen_job(self, genes, GI_genes_file=None, change: str = EXACT_CHANGE, seed: int = 0,
                   chunk_pairs: int = SCREEN_CHUNK_PAIRS) -> ScreenJob:
        """What ``screen`` computes, checked: the genes (unknown ones named all at once), the
        pairs, the predictor, the genes scores are taken on, and the Theil-Sen subsets."""
        self._require_weights()
        return ScreenJob.build(genes, self.node_map_pert, self.pert_data.gene2go, self.gene_list,
                               self.change_predictor(change, seed), GI_genes_file, self._train_conditions(),
                               model_record(self.best_model, self.weights_from), chunk_pairs)

    def _train_conditions(self) -> list[str]:
        """The perturbed conditions of the train set (none without a split)."""
        train = self.pert_data.set2conditions.get("train", []) if self.pert_data.set2conditions else []
        return [c for c in train if c != CONTROL]

    def plot_perturbation(self, query: str, save_file=None):
        """Box plots of the true change over control at the condition's top-20 non-dropout DE
        genes, with the predicted change marked; returns the matplotlib figure."""
        from gears_ddp.inference.figures import observed_change_at_de_genes, plot_perturbation_figure

        control = self.ctrl_expression.cpu().numpy()
        positions, observed = observed_change_at_de_genes(self.pert_data, query, control)
        genes = condition_genes(query)
        predicted = self.predict([genes])
        predicted = (predicted[0] if isinstance(predicted, tuple) else predicted)[query_keys([genes])[0]]
        return plot_perturbation_figure(observed, predicted[positions] - control[positions],
                                        [self.gene_list[p] for p in positions], query, save_file)

    # ------------------------------------------------------------------ checkpoints
    def save_model(self, path) -> None:
        """Write ``config.pkl``, ``model.pt`` (best model) and ``vocabulary.json`` atomically."""
        self._require_model()
        save_model_folder(path, self.config, self.best_model.state_dict(), self.gene_list, self.pert_list)

    def load_pretrained(self, path) -> None:
        """Load a model folder written by ``save_model``, by a distributed run or by the
        published GEARS (a ``module.`` prefix is stripped)."""
        config = read_config(path, [*ModelOptions.names(), *GRAPH_KEYS])
        check_vocabulary(path, config, self.gene_list, self.pert_list)
        options = {k: v for k, v in config.items() if k not in ("device", "num_genes", "num_perts")}
        self.model_initialize(**options)
        load_weights(self.model, path)
        self.best_model = self.model
        self.weights_from = str(path)



GEARS.model_initialize.__signature__ = signature_with(GEARS.model_initialize, ModelOptions)
GEARS.train.__signature__ = signature_with(GEARS.train, TrainingOptions)
