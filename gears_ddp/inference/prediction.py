"""What a trained network predicts for perturbation queries, as ``GEARS.predict`` and
``GEARS.GI_predict`` use it.

A query is a list of one or two genes of the perturbation vocabulary. In evaluation mode a
cell's prediction is its control expression plus the change its perturbation set causes
(``GEARSModel.set_effects``), so one forward pass per batch of sets gives the change of
every query, whatever control cells it is then added to.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from gears_ddp.data.perturbation_sets import PerturbationSets

PREDICTION_CELLS = 300  # control cells a prediction averages over, as in the published GEARS
QUERY_EXAMPLE = "e.g. [['FEV'], ['FEV', 'SAMD1']]"


def query_sets(pert_list, node_map_pert: Mapping[str, int]) -> torch.Tensor:
    """Perturbation-vocabulary indices of each query (Q x 2, -1 padded); a malformed query
    or an unknown gene is an error naming it."""
    if isinstance(pert_list, str) or not isinstance(pert_list, (list, tuple)) or not pert_list:
        raise ValueError(f"queries must be a non-empty list of gene lists, {QUERY_EXAMPLE}; got {pert_list!r}")
    for number, query in enumerate(pert_list):
        if isinstance(query, str):
            raise ValueError(f"query {number} is the string {query!r}, not a list of genes: write [{query!r}] "
                             f"({QUERY_EXAMPLE})")
        if not isinstance(query, (list, tuple)) or not 1 <= len(query) <= 2 \
                or not all(isinstance(gene, str) for gene in query):
            raise ValueError(f"query {number} must be a list of one or two gene names ({QUERY_EXAMPLE}); "
                             f"got {query!r}")
        if len(set(query)) < len(query):
            raise ValueError(f"query {number} names {query[0]!r} twice; a combination needs two different genes")
    unknown = sorted({g for query in pert_list for g in query if g not in node_map_pert})
    if unknown:
        raise ValueError(f"genes not in the perturbation vocabulary (GEARS.pert_list): {unknown}")
    rows = [[node_map_pert[g] for g in query] + [-1] * (2 - len(query)) for query in pert_list]
    return torch.tensor(rows, dtype=torch.long)


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


def drawn_control_cells(cell_table, seed: int, n_cells: int = PREDICTION_CELLS) -> torch.Tensor:
    """The expression (n_cells x G) of ``n_cells`` control cells drawn with replacement with
    ``seed``: the cells a published prediction averages over."""
    controls = cell_table.control_cells()
    generator = torch.Generator().manual_seed(seed)
    return cell_table.rows(controls[torch.randint(len(controls), (n_cells,), generator=generator)])
