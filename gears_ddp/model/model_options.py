"""The options of the GEARS network, defined once.

``GEARS.model_initialize``'s keyword arguments and signature, its checks, the model folder's
``config.pkl`` keys, ``train_multi_gpu``'s ``args['model_config']``, ``gears-ddp train
--help`` and docs/options.md all come from ``ModelOptions``. The defaults are the published
package's.
"""

from __future__ import annotations

from dataclasses import dataclass

from gears_ddp._options import Options, is_int, is_number, option

# the smallest value of each integer option
SMALLEST = {
    "hidden_size": 1,
    "num_go_gnn_layers": 0,
    "num_gene_gnn_layers": 0,
    "decoder_hidden_size": 1,
    "num_similar_genes_go_graph": 1,
    "num_similar_genes_co_express_graph": 1,
}


@dataclass
class ModelOptions(Options):
    """What ``GEARS.model_initialize`` accepts besides the graphs."""

    hidden_size: int = option(64, "hidden dimension")
    num_go_gnn_layers: int = option(1, "number of GNN layers on the GO graph")
    num_gene_gnn_layers: int = option(1, "number of GNN layers on the co-expression gene graph")
    decoder_hidden_size: int = option(16, "hidden dimension of the gene-specific decoder")
    num_similar_genes_go_graph: int = option(20, "most similar genes kept per gene in the GO graph")
    num_similar_genes_co_express_graph: int = option(20, "most similar genes kept per gene in the co-expression graph")
    coexpress_threshold: float = option(
        0.4, "Pearson correlation above which two genes are linked in the co-expression graph"
    )
    uncertainty: bool = option(False, "uncertainty mode: also predict a log-variance per gene")
    uncertainty_reg: float = option(1, "weight of the uncertainty loss against the prediction loss")
    direction_lambda: float = option(1e-1, "weight of the direction loss against the prediction loss")
    no_perturb: bool = option(False, "predict no change for every perturbation (a control model)")

    @classmethod
    def tunable_parameters(cls) -> dict[str, str]:
        """Each option with what it means and its default (``GEARS.tunable_parameters``)."""
        defaults = cls.defaults()
        return {name: f"{meaning}, default {defaults[name]!r}" for name, meaning in cls.help().items()}

    def check(self, where: str) -> None:
        for key, minimum in SMALLEST.items():
            value = getattr(self, key)
            if not (is_int(value) and value >= minimum):
                raise ValueError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")
        for key in ("coexpress_threshold", "uncertainty_reg", "direction_lambda"):
            value = getattr(self, key)
            if not (is_number(value) and value >= 0):
                raise ValueError(f"{where}: {key} must be a non-negative number, got {value!r}")
        if self.coexpress_threshold > 1:
            raise ValueError(
                f"{where}: coexpress_threshold is a correlation in [0, 1], got {self.coexpress_threshold!r}"
            )
        for key in ("uncertainty", "no_perturb"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{where}: {key} must be True or False, got {getattr(self, key)!r}")
