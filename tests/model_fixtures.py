"""Small random GEARS models and batches for model and loss tests."""

import torch

from gears_ddp.model.network import GEARSModel

N_GENES, N_PERTS, HIDDEN = 40, 25, 16


def random_graph(n_nodes, n_edges, generator):
    index = torch.randint(0, n_nodes, (2, n_edges), generator=generator)
    return index, torch.rand(n_edges, generator=generator)


def model_graphs(seed=0):
    """The (edge_index, edge_weight) of the co-expression and GO graphs of ``make_model(seed=seed)``."""
    generator = torch.Generator().manual_seed(seed)
    return random_graph(N_GENES, 200, generator), random_graph(N_PERTS, 150, generator)


def make_model(uncertainty=False, seed=0):
    coexpress, go = model_graphs(seed)
    torch.manual_seed(seed)
    return GEARSModel(N_GENES, N_PERTS, *coexpress, *go, hidden_size=HIDDEN, uncertainty=uncertainty)


def random_batch(batch_size=12, seed=1):
    """Cells drawn from a few conditions (controls, singles, combos written both ways)."""
    generator = torch.Generator().manual_seed(seed)
    sets = torch.tensor([[-1, -1], [3, -1], [5, -1], [3, 5], [5, 3], [7, 11]])
    pert_idx = sets[torch.randint(0, len(sets), (batch_size,), generator=generator)]
    pert_idx[0] = torch.tensor([3, 5])
    x = torch.rand(batch_size, N_GENES, generator=generator)
    return x, pert_idx
