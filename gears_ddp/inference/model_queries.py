"""A model's answers to perturbation queries, as ``GEARS`` gives them: mean predicted
expression with the published ``saved_pred`` semantics (``predict``), the predicted changes
of the sets (``effects``) and of a pair's A, B and A+B (``pair_changes``, which
``GI_predict`` scores), the change predictor screens use, and the observed pairs scored from
the model's predictions (``interaction_agreement``).

``ModelQueries`` takes explicit inputs: the network, its device, the data, and the
``saved_pred`` dicts themselves (``SavedPredictions``), whose entries it reads and writes
in place, so that a user sees them where the published package keeps them. Built for each
call from what the front holds then, it never outlives a change of weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from gears_ddp._version import __version__
from gears_ddp.data.pertdata import PertData
from gears_ddp.evaluation.baselines import baseline_effects
from gears_ddp.inference.prediction import (
    EXACT_CHANGE,
    PREDICTION_CELLS,
    ChangePredictor,
    checked_cell_count,
    drawn_control_cells,
    query_keys,
    query_sets,
    set_effects,
)
from gears_ddp.inference.saved_predictions import handed_in, saved_expression
from gears_ddp.interactions.agreement import agreement_record, compare_calls
from gears_ddp.interactions.observed import observed_interactions, predicted_interactions
from gears_ddp.interactions.pair_tables import trained_conditions
from gears_ddp.interactions.scores import scoring_device
from gears_ddp.model.model_folder import GRAPH_KEYS
from gears_ddp.runtime.memory_budget import FLOAT32_BYTES, refuse_beyond_memory

RETURN_TYPES = ("dict", "dataframe", "anndata", "cell-eval")
NO_MODEL = "no model yet: call model_initialize(...) or load_pretrained(path) first"
RANDOM_WEIGHTS = (
    "the model still has its random initial weights: train it (train(...)) or load trained weights "
    "(load_pretrained(path)) before predicting"
)


@dataclass
class SavedPredictions:
    """The published cache (``inference.saved_predictions``): ``saved`` (``saved_pred``),
    ``logvar_sums`` (``saved_logvar_sum``) and ``own``, the entries this model's
    ``predict`` wrote, which are never read back."""

    saved: dict = field(default_factory=dict)
    logvar_sums: dict = field(default_factory=dict)
    own: dict = field(default_factory=dict)

    def handed_in(self, keys: Sequence[str], uncertain: bool = False) -> dict:
        """The entries of ``keys`` that were handed in (with their uncertainty too when
        ``uncertain``)."""
        entries = handed_in(self.saved, self.own, keys)
        return {key: value for key, value in entries.items() if not uncertain or key in self.logvar_sums}

    def keep(self, key: str, prediction: np.ndarray, uncertainty: float | None) -> None:
        """Keep this model's ``prediction`` of ``key``, unless an entry handed in is there."""
        if key not in self.saved or self.saved[key] is self.own.get(key):
            self.saved[key] = self.own[key] = prediction.copy()
            if uncertainty is not None:
                self.logvar_sums[key] = float(uncertainty)


@dataclass
class ModelQueries:
    """The answers of ``network`` (the best model; None before there is one) on ``device``
    to queries on ``pert_data``. ``config`` is the network's published config (None before
    there is one), ``weights_origin`` where its weights came from (None: its random initial
    ones)."""

    network: torch.nn.Module | None
    device: torch.device
    pert_data: PertData
    saved: SavedPredictions
    config: dict | None = None
    weights_origin: str | None = None

    @property
    def provenance(self) -> dict:
        """What produces these predictions, for their ``uns['gears_ddp']``: the library
        version, the dataset, where the weights came from and the model options (graph
        tensors left out)."""
        if self.config is None:
            raise RuntimeError(NO_MODEL)
        return {
            "version": __version__,
            "dataset": self.pert_data.dataset_name,
            "weights_from": str(self.weights_origin),
            "config": {k: v for k, v in self.config.items() if k not in GRAPH_KEYS},
        }

    @property
    def uncertain(self) -> bool:
        """Whether the network predicts its uncertainty too (``saved_logvar_sum``)."""
        return self.config is not None and bool(self.config["uncertainty"])

    @property
    def weights_problem(self) -> str | None:
        """Why there are no trained weights to predict with (None: there are); only what
        needs the weights raises it. A ``no_perturb`` network predicts control as it is, so
        it needs none."""
        if self.config is None:
            return NO_MODEL
        return RANDOM_WEIGHTS if self.weights_origin is None and not self.config["no_perturb"] else None

    def require_weights(self) -> None:
        if self.weights_problem is not None:
            raise RuntimeError(self.weights_problem)

    def effects(self, sets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The predicted change (K x G) of each perturbation set, and its log-variance in
        uncertainty mode (else None), on the model's device."""
        self.require_weights()
        return set_effects(self.network, sets, self.device)

    def predict(
        self,
        pert_list,
        return_type: str = "dict",
        seed: int = 0,
        cells_per_perturbation: int = PREDICTION_CELLS,
        all_samples: bool = False,
    ):
        """``GEARS.predict``: the mean predicted expression for each query (a list of 1 or 2
        genes), over ``cells_per_perturbation`` control cells drawn with ``seed`` (with
        replacement), each with the query's perturbation applied.

        ``return_type``:

        - ``'dict'``: the reference's ``{'A_B': array}``; with uncertainty also
          ``{'A_B': exp(-mean logvar)}``;
        - ``'dataframe'``: queries (``'A_B'``) x gene names;
        - ``'anndata'``: one row per query named by its condition as the data writes it
          (``'A+ctrl'``, ``'A+B'``), the queried genes in ``obs`` (and ``uncertainty``), the
          genes as ``var``, ``provenance`` in ``uns['gears_ddp']``
          (``cell_eval_export.mean_predictions``);
        - ``'cell-eval'``: per-cell predictions in the layout of Arc Institute's cell-eval:
          the drawn control cells each with each query's predicted change (clipped at 0), so
          ``cells_per_perturbation`` cells per query, then the same cells as control
          (``cell_eval_export.cell_predictions``).

        Every prediction is kept in ``saved_pred`` (and its uncertainty in
        ``saved_logvar_sum``) under its ``'A_B'`` key, as published. For ``'dict'`` and
        ``'dataframe'`` a query whose entry was handed in there (written by the user, or
        copied from another ``GEARS``; with uncertainty, its ``saved_logvar_sum`` entry too)
        is answered from it, weights or none (``saved_predictions``); the others need trained
        weights.

        ``all_samples=True`` (an option of the paper's scripts, with ``'dict'``): each query's
        predicted cells, ``{'A_B': (cells_per_perturbation x genes)}``, instead of their mean;
        they are not kept in ``saved_pred``."""
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type must be one of {RETURN_TYPES}, got {return_type!r}")
        if all_samples and return_type != "dict":
            raise ValueError(
                "all_samples=True gives each query's predicted cells as arrays in a dict: it goes with "
                "return_type='dict' (return_type='cell-eval' gives them as an AnnData)"
            )
        sets = query_sets(pert_list, self.pert_data.node_map_pert)
        pert_list = [list(query) for query in pert_list]
        keys = query_keys(pert_list)
        from_saved = return_type in ("dict", "dataframe") and not all_samples
        saved = self.saved.handed_in(keys, self.uncertain) if from_saved else {}
        prediction = np.zeros((len(keys), len(self.pert_data.gene_names)), dtype=np.float32)
        uncertainty = np.zeros(len(keys)) if self.uncertain else None
        computed = [row for row, key in enumerate(keys) if key not in saved]
        if computed:
            self.require_weights()
            self._refuse_cells_beyond_memory(cells_per_perturbation, len(computed), return_type, all_samples)
            picked = drawn_control_cells(self.pert_data.cells, seed, cells_per_perturbation)
            effect, logvar = self.effects(sets[computed])
            prediction[computed] = (effect + picked.mean(0).to(self.device)).cpu().numpy()
            if uncertainty is not None:  # as self.uncertain
                assert logvar is not None  # a network in uncertainty mode gives the log-variance
                uncertainty[computed] = torch.exp(-logvar.mean(1)).cpu().numpy()
        if all_samples:
            cells = {key: (picked.to(self.device) + effect[row]).cpu().numpy() for row, key in enumerate(keys)}
            return cells if uncertainty is None else (cells, dict(zip(keys, uncertainty.tolist())))
        for row, key in enumerate(keys):
            if key in saved:
                prediction[row] = saved_expression(saved, [key], prediction.shape[1])[0]
                if uncertainty is not None:  # as self.uncertain
                    uncertainty[row] = self.saved.logvar_sums[key]
            else:
                self.saved.keep(key, prediction[row], None if uncertainty is None else uncertainty[row])
        if return_type == "dataframe":
            return pd.DataFrame(prediction, index=keys, columns=list(self.pert_data.gene_names))
        if return_type == "anndata":
            from gears_ddp.inference.cell_eval_export import mean_predictions

            return mean_predictions(
                self.pert_data, self.provenance, pert_list, prediction, uncertainty, seed, len(picked)
            )
        if return_type == "cell-eval":
            from gears_ddp.inference.cell_eval_export import cell_predictions

            return cell_predictions(self.pert_data, self.provenance, pert_list, picked, effect.cpu(), seed)
        predictions = dict(zip(keys, prediction))
        return predictions if uncertainty is None else (predictions, dict(zip(keys, uncertainty.tolist())))

    def _refuse_cells_beyond_memory(self, n_cells, n_queries: int, return_type: str, all_samples: bool) -> None:
        """Refuse a ``predict`` whose cells the machine cannot hold, before they are drawn:
        the ``n_cells`` drawn control cells, and with ``all_samples`` each query's cells, or
        for ``'cell-eval'`` each query's cells made and copied into the file's matrix."""
        n_cells = checked_cell_count(n_cells)
        rows = n_cells * (1 + (2 * n_queries + 1 if return_type == "cell-eval" else n_queries if all_samples else 0))
        refuse_beyond_memory(
            FLOAT32_BYTES * len(self.pert_data.gene_names) * rows,
            f"predict with cells_per_perturbation={n_cells:,} for {n_queries:,} "
            f"{'query' if n_queries == 1 else 'queries'} ({rows:,} cells x "
            f"{len(self.pert_data.gene_names):,} genes)",
            "ask for fewer cells per perturbation, or fewer queries in one call",
        )

    def mean_expression(self, genes: list[str]) -> np.ndarray:
        """The mean predicted expression (one value per gene) of one query, kept in
        ``saved_pred`` as ``predict`` keeps it."""
        predicted = self.predict([genes])
        return (predicted[0] if isinstance(predicted, tuple) else predicted)[query_keys([genes])[0]]

    def change_predictor(self, change: str = EXACT_CHANGE, seed: int = 0) -> ChangePredictor:
        """The model's predicted changes over control, exact or with the published sampling
        noise (``prediction.ChangePredictor``)."""
        self.require_weights()
        return ChangePredictor.for_data(self.network, self.device, self.pert_data.cells, change, seed)

    def pair_changes(self, combo, change: str = EXACT_CHANGE, seed: int = 0) -> torch.Tensor:
        """The changes over control (3 x genes) of A, B and A+B that ``GI_predict`` scores:
        the entries handed in to ``saved_pred`` for ``'A'``, ``'B'`` and ``'A_B'`` minus the
        mean of all control cells when all three are there, as published, weights or none;
        else the model's (``change_predictor``)."""
        if isinstance(combo, str) or len(combo) != 2 or not all(isinstance(gene, str) for gene in combo):
            raise ValueError(f"GI_predict takes two genes, got {combo!r}")
        keys = [combo[0], combo[1], "_".join(combo)]
        saved = self.saved.handed_in(keys)
        if len(saved) == len(keys):
            control = self.pert_data.require_data().control_mean().double().numpy()
            return torch.from_numpy(saved_expression(saved, keys, len(self.pert_data.gene_names)) - control)
        sets = query_sets([[combo[0]], [combo[1]], list(combo)], self.pert_data.node_map_pert)
        if self.weights_problem is not None:
            missing = [key for key in keys if key not in saved]
            raise RuntimeError(
                f"{self.weights_problem}; or hand in the predictions GI_predict scores without "
                f"weights: saved_pred needs {missing} beside {sorted(saved)}"
            )
        return self.change_predictor(change, seed).changes(sets)

    def interaction_agreement(
        self, observed: pd.DataFrame, GI_genes_file=None, train_conditions: Sequence[str] = ()
    ) -> dict:
        """The pairs of ``observed`` (``interactions.observed.observed_interactions``) scored
        from the model's exact predicted changes, whatever its weights, beside the observed
        scores: ``{'observed', 'predicted', 'agreement'}`` (``agreement.compare_calls``)."""
        predictor = ChangePredictor.for_data(self.network, self.device, self.pert_data.cells)
        node_map_pert = self.pert_data.node_map_pert

        def changes(queries):
            return predictor.changes(query_sets(queries, node_map_pert))

        predicted = predicted_interactions(
            observed, changes, list(self.pert_data.gene_names), GI_genes_file, train_conditions, predictor.device
        )
        return {"observed": observed, "predicted": predicted, "agreement": compare_calls(observed, predicted)}

    def split_agreement(self, split: str | None = "test", GI_genes_file=None) -> dict:
        """``GEARS.interaction_agreement``: the observed pairs of ``split`` scored from their
        observed changes and from the model's (``interaction_agreement``), on the model's GPU
        if it has one (``scores.scoring_device``)."""
        self.require_weights()
        observed = observed_interactions(self.pert_data, split, GI_genes_file, scoring_device(self.device))
        return self.interaction_agreement(observed, GI_genes_file, trained_conditions(self.pert_data.set2conditions))

    def test_interactions(self) -> dict | None:
        """For the run report: the test combinations whose singles were observed, scored from
        their observed and from the model's predicted changes, and how far the calls agree
        (``agreement.agreement_record``); None without such combinations."""
        observed = observed_interactions(self.pert_data, "test", device=scoring_device(self.device))
        if not len(observed):
            return None
        train = trained_conditions(self.pert_data.set2conditions)
        return agreement_record("test", self.interaction_agreement(observed, None, train))

    def split_predictions(
        self,
        loaders: dict,
        split: str,
        clip_at_zero: bool,
        cells_per_perturbation: int | None,
        seed: int,
        baseline: str | None = None,
        other_screen=None,
    ):
        """``GEARS.predict_split``: predicted and real AnnData of ``split`` in cell-eval's
        layout (``cell_eval_export.split_predictions``), from the model's predicted changes
        or from those of ``baseline`` (``other_screen``: the embedding ``linear_pretrained``
        places perturbations by)."""
        from gears_ddp.inference.cell_eval_export import split_predictions

        self.require_weights()
        effects, provenance = self.effects, self.provenance
        if baseline is not None:
            effects = baseline_effects(self.pert_data, baseline, other_screen)
            provenance["baseline"] = baseline
        return split_predictions(
            self.pert_data, loaders, effects, provenance, split, clip_at_zero, cells_per_perturbation, seed
        )
