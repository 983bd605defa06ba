"""The one graph operator GEARS uses: a simplified graph convolution (SGC, one hop).

``SimpleGraphConv(x, edge_index, edge_weight) = Linear(A_hat @ x)``, where ``A_hat`` is
the symmetrically normalised weighted adjacency with self-loops: every existing self-loop
is removed and each node gets one self-loop carrying the weight of its former self-loop
(1 if it had none), then ``w_ij / sqrt(deg_i * deg_j)`` with ``deg`` the summed weight of
the edges entering a node (0 for a node of degree 0). Messages flow from ``edge_index[0]``
to ``edge_index[1]``.

This is torch_geometric's ``SGConv(in, out, K=1)`` with its defaults, with the same
parameter names (``lin.weight``, ``lin.bias``) and initialisation, so GEARS checkpoints
load either way; the test suite checks outputs and gradients against it. It is written
here because importing torch_geometric costs every process about 130 MiB of private
memory and over a second (it imports ``torch._dynamo`` and sympy), which each
distributed rank would pay for two sparse products.
"""
from __future__ import annotations

import torch
from torch import nn


def normalised_edges(edge_index: torch.Tensor, edge_weight: torch.Tensor, num_nodes: int, dtype: torch.dtype):
    """(source, target, weight) of ``A_hat``'s edges (see the module docstring), weights in ``dtype``."""
    source, target = edge_index[0], edge_index[1]
    weight = edge_weight.to(dtype)
    is_loop = source == target
    loop_weight = torch.ones(num_nodes, dtype=dtype, device=weight.device)
    loop_weight[source[is_loop]] = weight[is_loop]
    nodes = torch.arange(num_nodes, device=source.device)
    source = torch.cat([source[~is_loop], nodes])
    target = torch.cat([target[~is_loop], nodes])
    weight = torch.cat([weight[~is_loop], loop_weight])
    degree = torch.zeros(num_nodes, dtype=dtype, device=weight.device).index_add_(0, target, weight)
    inverse_sqrt = degree.pow(-0.5).masked_fill(degree == 0, 0.0)
    return source, target, inverse_sqrt[source] * weight * inverse_sqrt[target]


class NormalisedAdjacency(nn.Module):
    """``x -> A_hat @ x`` for one fixed graph, with ``A_hat``'s edges computed once, when the
    module is built, instead of on every forward pass (the graphs never change in training).

    Messages are gathered with ``index_select`` and summed with ``index_add_``: the backward
    pass of that pair is another gather and sum, where plain tensor indexing would scatter
    its gradient with a sorting ``index_put_``. Edges are kept sorted by target with each
    node's first edge (``first_edge``), so that a few rows of ``A_hat @ x`` cost only the
    edges entering them. The edges are non-persistent buffers: they move with the module and
    stay out of its ``state_dict``.
    """

    def __init__(self, edge_index: torch.Tensor, edge_weight: torch.Tensor, num_nodes: int):
        super().__init__()
        source, target, weight = normalised_edges(edge_index.long(), edge_weight, num_nodes, edge_weight.dtype)
        order = torch.argsort(target, stable=True)
        self.register_buffer("source", source[order], persistent=False)
        self.register_buffer("target", target[order], persistent=False)
        self.register_buffer("weight", weight[order], persistent=False)
        first_edge = torch.zeros(num_nodes + 1, dtype=torch.long, device=target.device)
        first_edge[1:] = torch.cumsum(torch.bincount(target, minlength=num_nodes), 0)
        self.register_buffer("first_edge", first_edge, persistent=False)

    def forward(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``A_hat @ x``, or only its ``rows`` (a 1-D index tensor) in that order."""
        if rows is None:
            source, target, weight, n_out = self.source, self.target, self.weight, x.shape[0]
        else:
            edges, target = self._edges_into(rows)
            source, weight, n_out = self.source[edges], self.weight[edges], len(rows)
        messages = x.index_select(0, source) * weight.to(x.dtype).unsqueeze(1)
        return x.new_zeros(n_out, x.shape[1]).index_add_(0, target, messages)

    def _edges_into(self, rows: torch.Tensor):
        """The edges entering ``rows`` and, for each, the position of its target in ``rows``."""
        starts = self.first_edge[rows]
        counts = self.first_edge[rows + 1] - starts
        position = torch.repeat_interleave(torch.arange(len(rows), device=rows.device), counts)
        offset_in_row = torch.arange(len(position), device=rows.device) - (torch.cumsum(counts, 0) - counts)[position]
        return starts[position] + offset_in_row, position


class SimpleGraphConv(nn.Module):
    """One-hop simplified graph convolution: ``lin(A_hat @ x)`` (see the module docstring)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels)
        # initialised a second time, as SGConv does (its Linear on construction, then the
        # convolution's reset), so that a torch seed gives SGConv's weights
        self.lin.reset_parameters()

    def forward(self, x: torch.Tensor, adjacency: NormalisedAdjacency, rows: torch.Tensor | None = None):
        """``lin(A_hat @ x)``, or only its ``rows``."""
        return self.lin(adjacency(x, rows))
