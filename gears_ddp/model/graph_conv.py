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
here because importing torch_geometric costs every distributed rank memory and start-up
time (it imports ``torch._dynamo`` and sympy) for two sparse products (docs/architecture.md's
dependencies section has the measured cost).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

from gears_ddp.model.linear import linear
from gears_ddp.model.weighted_norm import in_cache_pieces

MESSAGE_BYTES_PER_PIECE = 16 * 2**20  # below glibc's mmap thresholds (at most 32 MiB)


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

    Two forms of the same edges, each where it is the faster:

    - **On a CPU, the whole product** runs as a sparse (CSR) matrix product, and its backward
      pass as the product with the transposed matrix, also kept (``_SparseProduct``; a graph
      with repeated edges has one matrix per repeat, ``_layered_csr``): several times faster
      there than the gather below, whose table pads every node to the most incoming edges and
      whose backward is a batched outer product and a scatter (benchmarks/RESULTS.md has the
      timings). Under autocast or in half precision it runs in float32 (the
      CPU kernel has no bfloat16), its result cast to ``x``'s dtype.
    - **On a GPU, in a ``torch.compile``d graph, and for a few rows** (``rows``), a gather:
      each node's incoming edges are one row of a (nodes x most incoming edges) table of
      sources and weights, padded with weight 0; ``A_hat @ x``, or a few of its rows, is a
      gather of the sources' rows of ``x`` and one batched product with the weights. Every
      size is fixed when the module is built, so nothing waits for the device to learn a
      size and a CUDA graph can capture it. The whole product's backward pass is the same
      gather over a second table, of each node's outgoing edges (``_GatheredProduct``), not
      a scatter of every edge; a few rows' is autograd's (a scatter of their edges only).

    All are non-persistent buffers: they move with the module and stay out of its
    ``state_dict``.
    """

    # buffers (``register_buffer``), declared for the type checker
    sources: torch.Tensor
    weights: torch.Tensor
    sources_t: torch.Tensor
    weights_t: torch.Tensor
    nodes_t: torch.Tensor | None

    def __init__(self, edge_index: torch.Tensor, edge_weight: torch.Tensor, num_nodes: int):
        super().__init__()
        source, target, weight = normalised_edges(edge_index.long(), edge_weight, num_nodes, edge_weight.dtype)
        order = torch.argsort(target * num_nodes + source, stable=True)  # by target, then source
        source, target, weight = source[order], target[order], weight[order]
        self.num_nodes = num_nodes
        for suffix, (rows, columns) in (("", (target, source)), ("_t", (source, target))):  # A_hat, its transpose
            for name, tensor in zip(("crow", "col", "values"), _layered_csr(rows, columns, weight, num_nodes)):
                self.register_buffer(name + suffix, tensor, persistent=False)
        # A_hat's rows: each node's incoming edges, one row of the table per node
        sources, weights, _ = _padded_rows(target, source, weight, num_nodes)
        self.register_buffer("sources", sources, persistent=False)  # nodes x width
        self.register_buffer("weights", weights, persistent=False)  # nodes x 1 x width
        # its transpose's, for the backward pass: each node's outgoing edges, in rows of the same
        # width (a node with more takes several rows, whose sums ``nodes_t`` adds up; None where
        # every node takes one row)
        order = torch.argsort(source * num_nodes + target, stable=True)  # by source, then target
        sources_t, weights_t, nodes_t = _padded_rows(
            source[order], target[order], weight[order], num_nodes, width=sources.shape[1]
        )
        self.register_buffer("sources_t", sources_t, persistent=False)
        self.register_buffer("weights_t", weights_t, persistent=False)
        self.register_buffer("nodes_t", nodes_t if len(nodes_t) > num_nodes else None, persistent=False)

    def forward(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``A_hat @ x``, or only its ``rows`` (a 1-D index tensor) in that order."""
        if rows is None and uses_sparse_product(x):
            return _SparseProduct.apply(x, self._sparse(""), self._sparse("_t"))
        if rows is None:
            return _GatheredProduct.apply(x, self.sources, self.weights, self.sources_t, self.weights_t, self.nodes_t)
        # a few rows: their edges gathered, and autograd's backward (a scatter of those edges)
        return _gathered(x, self.sources.index_select(0, rows), self.weights.index_select(0, rows))

    def _sparse(self, suffix: str) -> torch.Tensor:
        """The CSR matrix (its layers: ``_layered_csr``) of the buffers ``crow``, ``col`` and
        ``values`` with ``suffix`` ('' for ``A_hat``, '_t' for its transpose), a view of them
        made for each pass: buffers move with the module (``.to``, ``.double``) and pickle as
        any tensor. Its invariants were checked when the arrays were made."""
        row_pointers = getattr(self, "crow" + suffix)
        with _csr_beta_warning_ignored():
            return torch.sparse_csr_tensor(
                row_pointers,
                getattr(self, "col" + suffix),
                getattr(self, "values" + suffix),
                (len(row_pointers) - 1, self.num_nodes),
                check_invariants=False,
            )


def uses_sparse_product(x: torch.Tensor) -> bool:
    """Whether ``A_hat @ x`` (every row) runs as the CSR product: on a CPU (a device whose
    row-wise passes run in cache-sized pieces, ``weighted_norm.in_cache_pieces``, so that
    counting a GPU's work on a CPU with a GPU's pieces counts its gathers too), outside
    ``torch.compile`` (whose graphs take no sparse tensors); else as the gather."""
    return in_cache_pieces(x.device) and not torch.compiler.is_compiling()


def _layered_csr(rows: torch.Tensor, columns: torch.Tensor, values: torch.Tensor, num_nodes: int):
    """(row pointers, column indices, values) of the CSR matrix ``[A_1; ...; A_K]`` (K *
    ``num_nodes`` x ``num_nodes``) whose layers sum to the matrix with ``values`` at
    (``rows``, ``columns``): a repeated entry's k-th copy is in layer k, so that every weight
    is kept as it is (summing repeats into one weight would round them in the weights'
    precision, where the published model multiplies each). K is 1 for a graph without
    repeated edges."""
    key = rows * num_nodes + columns
    order = torch.argsort(key, stable=True)
    key, values = key[order], values[order]
    _, counts = torch.unique_consecutive(key, return_counts=True)
    run_starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    layer = torch.arange(len(key), device=key.device) - run_starts  # each copy's place among its repeats
    layers = int(layer.max()) + 1 if len(layer) else 1
    indices = torch.stack([layer * num_nodes + key // num_nodes, key % num_nodes])
    # invariants checked for the COO matrix and its CSR conversion alike (torch 2.11 warns, for
    # each sparse tensor made without the check set either way, that it is "implicitly disabled")
    with _csr_beta_warning_ignored(), torch.sparse.check_sparse_tensor_invariants(enable=True):
        matrix = torch.sparse_coo_tensor(indices, values, (layers * num_nodes, num_nodes)).coalesce().to_sparse_csr()
    return matrix.crow_indices(), matrix.col_indices(), matrix.values()


@contextlib.contextmanager
def _csr_beta_warning_ignored():
    """Without the warning torch gives, once per process, that its CSR layout is in beta."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
        yield


class _SparseProduct(torch.autograd.Function):
    """``matrix @ x`` with the backward pass ``transposed @ grad`` (both CSR, on a CPU), in
    float32 at least, outside autocast (the CPU kernel has no half precision); the result and
    the gradient in ``x``'s dtype."""

    @staticmethod
    def forward(ctx, x, matrix, transposed):
        ctx.transposed = transposed
        return _sparse_mm(matrix, x)

    @staticmethod
    def backward(ctx, grad):  # grad has the output's dtype, which is x's
        return _sparse_mm(ctx.transposed, grad), None, None


def _sparse_mm(layered: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """The product of the matrix whose layers ``layered`` holds (``_layered_csr``) with ``dense``."""
    dtype = torch.promote_types(dense.dtype, torch.float32)
    with torch.autocast("cpu", enabled=False):
        product = torch.mm(layered.to(dtype), dense.to(dtype))
    if len(product) > len(dense):
        product = product.view(-1, *dense.shape).sum(0)
    return product.to(dense.dtype)


def _padded_rows(
    heads: torch.Tensor, tails: torch.Tensor, weight: torch.Tensor, num_nodes: int, width: int | None = None
):
    """The edges (``heads[i]`` <- ``tails[i]``, grouped by head) as rows of a table ``width``
    wide (None: the most edges of a head, so one row per head): each head's edges fill rows
    of their own (at least one), padded with tail 0 and weight 0. Returns the tails (rows x
    width), the weights (rows x 1 x width) and each row's head (rows)."""
    degree = torch.bincount(heads, minlength=num_nodes)
    if width is None:
        width = max(1, int(degree.max())) if num_nodes else 1
    per_node = torch.div(degree + width - 1, width, rounding_mode="floor").clamp(min=1)
    first_row = torch.cumsum(per_node, 0) - per_node
    place = torch.arange(len(heads), device=heads.device) - (torch.cumsum(degree, 0) - degree)[heads]
    row, slot = first_row[heads] + torch.div(place, width, rounding_mode="floor"), place % width
    n_rows = int(per_node.sum())
    tails_table = torch.zeros(n_rows, width, dtype=torch.long, device=heads.device)
    weights_table = torch.zeros(n_rows, 1, width, dtype=weight.dtype, device=heads.device)
    tails_table[row, slot] = tails
    weights_table[row, 0, slot] = weight
    return tails_table, weights_table, torch.repeat_interleave(torch.arange(num_nodes, device=heads.device), per_node)


class _GatheredProduct(torch.autograd.Function):
    """``A_hat @ x`` as a gather of each node's incoming edges (``sources``, ``weights``), and
    its backward pass ``A_hat.T @ grad`` as the same gather of each node's outgoing edges
    (``sources_t``, ``weights_t``, ``nodes_t``), instead of autograd's backward of a gather, a
    scatter of every edge's message by atomic additions: on an H200 that scatter took 317 us
    of a Norman-size step (5,000 genes, 105,000 edges), the gather over the outgoing edges
    80 us (benchmarks/RESULTS.md, 2026-12-04)."""

    @staticmethod
    def forward(ctx, x, sources, weights, sources_t, weights_t, nodes_t):
        ctx.save_for_backward(sources_t, weights_t, nodes_t)
        ctx.x_dtype, ctx.num_nodes = x.dtype, x.shape[0]
        return _gathered(x, sources, weights)

    @staticmethod
    def backward(ctx, grad):
        sources_t, weights_t, nodes_t = ctx.saved_tensors
        # in x's precision (a half-precision gradient under autocast summed in float32, as
        # autograd's scatter into x's gradient sums it)
        grad_x = _gathered(grad.to(ctx.x_dtype), sources_t, weights_t, nodes_t, ctx.num_nodes)
        return grad_x, None, None, None, None, None


def _gathered(
    x: torch.Tensor, sources: torch.Tensor, weights: torch.Tensor, nodes: torch.Tensor | None = None, num_nodes: int = 0
) -> torch.Tensor:
    """Each row of ``sources`` (node indices into ``x``) gathered and summed with its
    ``weights``: one row per node, or with ``nodes`` (each row's node) the rows of each of
    ``num_nodes`` nodes added up (a node whose edges fill several rows).

    On a CPU the rows a gather collects are made a piece of nodes at a time, each piece at
    most ``MESSAGE_BYTES_PER_PIECE``: a whole gather at 18,000 genes is about 100 MiB, above
    glibc's largest mmap threshold, so each step would map it and fault its pages in again;
    pieces come from the heap, which keeps them for the next step while training
    (``runtime.host_memory``)."""
    weights = weights.to(x.dtype)
    node_bytes = sources.shape[1] * x.shape[1] * x.element_size()
    per_piece = len(sources) if x.device.type != "cpu" else max(1, MESSAGE_BYTES_PER_PIECE // max(node_bytes, 1))
    if per_piece >= len(sources):
        rows = _aggregated(x, sources, weights)
    else:
        rows = torch.cat(
            [
                _aggregated(x, sources[start : start + per_piece], weights[start : start + per_piece])
                for start in range(0, len(sources), per_piece)
            ]
        )
    if nodes is None:
        return rows
    return rows.new_zeros(num_nodes, rows.shape[1]).index_add_(0, nodes, rows)


def _aggregated(x: torch.Tensor, sources: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each row of ``sources`` (node indices into ``x``) gathered and summed with its ``weights``."""
    messages = x.index_select(0, sources.view(-1)).view(*sources.shape, x.shape[1])
    return torch.bmm(weights, messages).view(len(sources), x.shape[1])


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
        return linear(adjacency(x, rows), self.lin)
