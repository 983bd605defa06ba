"""What a trained network predicts for perturbation queries, as ``GEARS.predict``,
``GEARS.GI_predict`` and screens use it.

A query is a list of one or two genes of the perturbation vocabulary. In evaluation mode a
cell's prediction is its control expression plus the change its perturbation set causes
(``GEARSModel.set_effects``), so one forward pass per batch of sets gives the change of
every query, whatever control cells it is then added to.

The change a set causes is therefore exact: the prediction over any set of control cells
minus the mean of those same cells. The published ``GI_predict`` instead averages the
prediction over 300 control cells drawn at random for each set and subtracts the mean of
all control cells, which adds to each set's change the drawn cells' mean minus the full
mean: sampling noise, different for every set. ``ChangePredictor`` gives either
(``CHANGE_MODES``); the second only to reproduce published numbers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from gears_ddp.data.perturbation_sets import PerturbationSets
from gears_ddp.data.screen_report import listed

PREDICTION_CELLS = 300  # control cells a prediction averages over, as in the published GEARS
QUERY_EXAMPLE = "e.g. [['FEV'], ['FEV', 'SAMD1']]"
EXACT_CHANGE = "exact"
DRAWN_CELLS_CHANGE = "drawn-cells-minus-control-mean"
CHANGE_MODES = {
    EXACT_CHANGE: "the model's predicted change over control: the prediction over any control cells minus their mean",
    DRAWN_CELLS_CHANGE: f"as the published GI_predict: the mean prediction over {PREDICTION_CELLS} control cells "
    "drawn at random for each perturbation set, minus the mean of all control cells (adds "
    "sampling noise; for reproducing published numbers)",
}
# A forward pass holds (sets x genes) rows of hidden width: on a GPU up to SETS_PER_PASS sets,
# elsewhere as many as ROWS_PER_PASS rows hold (a pass of 64 sets at 2,000 genes in float64, as
# the interaction scores predict, holds hundreds of MiB of host memory; 16,384 rows a few tens).
SETS_PER_PASS = 64
ROWS_PER_PASS = 1 << 14


def query_sets(pert_list, node_map_pert: Mapping[str, int]) -> torch.Tensor:
    """Perturbation-vocabulary indices of each query (Q x 2, -1 padded); a malformed query
    or an unknown gene is an error naming it."""
    if isinstance(pert_list, str) or not isinstance(pert_list, (list, tuple)) or not pert_list:
        raise ValueError(f"queries must be a non-empty list of gene lists, {QUERY_EXAMPLE}; got {pert_list!r}")
    for number, query in enumerate(pert_list):
        if isinstance(query, str):
            raise ValueError(
                f"query {number} is the string {query!r}, not a list of genes: write [{query!r}] ({QUERY_EXAMPLE})"
            )
        if (
            not isinstance(query, (list, tuple))
            or not 1 <= len(query) <= 2
            or not all(isinstance(gene, str) for gene in query)
        ):
            raise ValueError(f"query {number} must be a list of one or two gene names ({QUERY_EXAMPLE}); got {query!r}")
        if len(set(query)) < len(query):
            raise ValueError(f"query {number} names {query[0]!r} twice; a combination needs two different genes")
    refuse_unknown_genes([g for query in pert_list for g in query], node_map_pert, "(GEARS.pert_list)")
    rows = [[node_map_pert[g] for g in query] + [-1] * (2 - len(query)) for query in pert_list]
    return torch.tensor(rows, dtype=torch.long)


def refuse_unknown_genes(genes: Sequence[str], vocabulary, named: str) -> None:
    """Refuse the ``genes`` that are not in the perturbation ``vocabulary`` (``named``: which
    one, e.g. the model folder's), naming them, and for each that differs from one there
    only in case, that one: symbols are case-sensitive (``Fev`` is not ``FEV``)."""
    unknown = sorted(set(genes) - set(vocabulary))
    if not unknown:
        return
    by_case = {str(gene).upper(): gene for gene in vocabulary}
    cased = [f"{gene} -> {by_case[gene.upper()]}" for gene in unknown if gene.upper() in by_case]
    raise ValueError(
        f"{len(unknown)} gene(s) not in the perturbation vocabulary {named}: {listed(map(repr, unknown))}"
        + (f" (gene symbols are case-sensitive: {', '.join(cased)})" if cased else "")
    )


def query_keys(pert_list: Sequence[Sequence[str]]) -> list[str]:
    """The published names of queries' predictions: ``'A'``, ``'A_B'``."""
    return ["_".join(query) for query in pert_list]


@torch.no_grad()
def set_effects(network, sets: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``network``'s predicted change from control (K x G) of each perturbation set (K x 2,
    -1 padded) in evaluation mode, and its log-variance in uncertainty mode (else None), on
    ``device``."""
    network.eval()
    return network.set_effects(PerturbationSets.each_once(sets.to(device)))


def sets_per_pass(num_genes: int, device) -> int:
    """Perturbation sets per forward pass of a network of ``num_genes`` genes on ``device``:
    ``SETS_PER_PASS`` on a GPU, elsewhere as many as ``ROWS_PER_PASS`` rows hold (at least
    one, at most ``SETS_PER_PASS``), which bounds a pass's memory whatever the genes."""
    if torch.device(device).type == "cuda":
        return SETS_PER_PASS
    return max(1, min(SETS_PER_PASS, ROWS_PER_PASS // num_genes))


def set_effects_in_passes(
    network, sets: torch.Tensor, device: torch.device, sets_in_a_pass: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``set_effects`` of any number of sets, ``sets_in_a_pass`` sets per forward pass (which
    bounds the (sets x genes) rows of hidden width a pass holds; by default
    ``sets_per_pass``)."""
    if sets_in_a_pass is None:
        sets_in_a_pass = sets_per_pass(network.num_genes, device)
    parts = [set_effects(network, batch, device) for batch in sets.split(sets_in_a_pass)]
    if not parts:
        return torch.empty(0, network.num_genes, device=device), None
    logvars = [part[1] for part in parts if part[1] is not None]  # every part's, or none (no uncertainty)
    logvar = torch.cat(logvars) if logvars else None
    return torch.cat([part[0] for part in parts]), logvar


def checked_cell_count(n_cells) -> int:
    """``n_cells``, the number of cells predicted per perturbation, if it is a whole number
    >= 1; else an error naming it."""
    if isinstance(n_cells, bool) or not isinstance(n_cells, (int, np.integer)) or n_cells < 1:
        raise ValueError(f"cells_per_perturbation must be a whole number >= 1, got {n_cells!r}")
    return int(n_cells)


def drawn_controls(cell_table, seed: int, n_cells: int = PREDICTION_CELLS) -> torch.Tensor:
    """The rows in ``cell_table`` of ``n_cells`` control cells drawn with replacement with
    ``seed``: the cells a published prediction averages over, and the cells each
    perturbation's predicted cells start from."""
    controls = cell_table.control_cells()
    generator = torch.Generator().manual_seed(seed)
    return controls[torch.randint(len(controls), (checked_cell_count(n_cells),), generator=generator)]


def drawn_control_cells(cell_table, seed: int, n_cells: int = PREDICTION_CELLS) -> torch.Tensor:
    """The expression (n_cells x G) of the control cells ``drawn_controls`` draws."""
    return cell_table.rows(drawn_controls(cell_table, seed, n_cells))


def checked_change_mode(change: str) -> str:
    """``change`` if it is one of ``CHANGE_MODES``, else an error listing them."""
    if change not in CHANGE_MODES:
        raise ValueError(f"change must be one of {list(CHANGE_MODES)}, got {change!r}")
    return change


def checked_draw_seed(seed) -> int:
    """``seed`` if it can seed the draws of control cells (a non-negative integer), else an
    error naming it."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"the seed of the drawn control cells must be a non-negative integer, got {seed!r}")
    return int(seed)


def control_draws(sets: torch.Tensor, n_controls: int, seed: int, n_cells: int = PREDICTION_CELLS) -> torch.Tensor:
    """The control cells (sets x ``n_cells`` positions among ``n_controls``, drawn with
    replacement) whose mean prediction the published ``GI_predict`` takes for each
    perturbation set. Each set's draw depends only on ``seed`` and its genes (in either
    order), so a set gets the same cells in a screen and in ``GI_predict``, in any process."""
    canonical = torch.sort(sets.cpu(), dim=1).values + 1
    draws = [np.random.default_rng([seed, *row]).integers(0, n_controls, n_cells) for row in canonical.tolist()]
    return torch.from_numpy(np.stack(draws)) if draws else torch.empty(0, n_cells, dtype=torch.long)


@dataclass
class ChangePredictor:
    """The change from control that ``network`` predicts for perturbation sets, on ``device``.

    ``change`` (``CHANGE_MODES``): ``'exact'``, the network's change (``set_effects``); or
    ``'drawn-cells-minus-control-mean'``, the published ``GI_predict``'s: that change plus,
    for each set, the mean of ``PREDICTION_CELLS`` control cells drawn for it
    (``control_draws`` with ``seed``) minus ``control_mean``. ``controls`` (control cells x
    genes) and ``control_mean`` are needed for the second only. Picklable: spawned workers
    receive one.

    ``for_data`` evaluates a float64 copy of the network. In float32 a set's change depends,
    by rounding (about 1e-8), on which other sets share its forward pass, and the Theil-Sen
    coefficients of the scores amplify that: their spatial median stops at the first step
    under 1e-3, and inputs moved by 1e-9 can change that step and the coefficients by 1e-3.
    In float64 a pair scores the same in a screen and in ``GI_predict``.
    """

    network: torch.nn.Module
    device: torch.device
    change: str = EXACT_CHANGE
    seed: int = 0
    controls: torch.Tensor | None = None
    control_mean: torch.Tensor | None = None

    @classmethod
    def for_data(cls, network, device, cell_table, change: str = EXACT_CHANGE, seed: int = 0) -> "ChangePredictor":
        """A predictor of a float64 copy of ``network``, with the control cells of
        ``cell_table`` when ``change`` needs them."""
        network = copy.deepcopy(network).double().eval()
        if checked_change_mode(change) == EXACT_CHANGE:
            return cls(network, torch.device(device), change, seed)
        return cls(
            network,
            torch.device(device),
            change,
            checked_draw_seed(seed),
            cell_table.rows(cell_table.control_cells()),
            cell_table.control_mean(),
        )

    def to(self, device) -> "ChangePredictor":
        """The same predictor with its network on ``device`` (a copy when the device differs)."""
        device = torch.device(device)
        network = self.network if device == self.device else copy.deepcopy(self.network).to(device)
        return ChangePredictor(network, device, self.change, self.seed, self.controls, self.control_mean)

    def changes(self, sets: torch.Tensor, sets_in_a_pass: int | None = None) -> torch.Tensor:
        """The change (sets x genes, in the network's precision, on ``device``) of each
        perturbation set (sets x 2 vocabulary indices, -1 padded), ``sets_in_a_pass`` sets per
        forward pass (by default ``sets_per_pass``)."""
        effects = set_effects_in_passes(self.network, sets, self.device, sets_in_a_pass)[0]
        if self.change == EXACT_CHANGE:
            return effects
        if self.controls is None or self.control_mean is None:
            raise ValueError(f"change {self.change!r} needs the control cells: build the predictor with for_data")
        draws = control_draws(sets, len(self.controls), self.seed)
        drawn_means = torch.nn.functional.embedding_bag(draws, self.controls, mode="mean")
        return effects + (drawn_means - self.control_mean).to(self.device, effects.dtype)
