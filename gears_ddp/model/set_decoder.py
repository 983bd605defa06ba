"""GEARS's per-gene decoder over (perturbation set, gene) rows in training mode, as one
autograd function.

For each distinct perturbation set ``s`` (``counts[s]`` cells) and gene ``g`` the model
decodes the row ``x[s, g] = genes[g] + shifts[s]`` through BatchNorm, ReLU and Linear
layers, with training-mode BatchNorm statistics over all rows weighted by ``counts``. This
is the bulk of a training step (S x G rows), and autograd's module-by-module chain spends
most of it allocating and re-reading row-sized tensors. Here the first BatchNorm's
statistics come from the two small tables (its input rows are never built), the last
BatchNorm and the output dot product are one vector product per row, the backward pass
recomputes the ReLU outputs and overwrites its few kept tensors in place, and the
row-sized tensors are three buffers kept from step to step (``RowBuffers``); everything
else runs ``rows_per_pass`` rows at a time.

Outputs and gradients are those of the module chain (the test suite compares them in
float64). With ``synchronize`` (distributed ``sync_batchnorm``) the statistics and the
backward sums run over the rows of all ranks. docs/performance.md ("The fused decoder")
gives the computation and each of these steps.
"""

from __future__ import annotations

from typing import Protocol, cast, overload

import torch
from torch import nn

from gears_ddp.model.weighted_norm import (
    RowShares,
    WeightedBatchNorm1d,
    block_shares,
    block_slices,
    blocks_of,
    column_dot,
    first_dim_sum,
    full_precision,
    mean_and_variance,
    minus_block_shares,
    normalisation_backward,
    relu_mask_,
    relu_normalised,
    statistics_gradient,
    summed_over_ranks,
    update_running_statistics,
    weighted_moments,
    weighted_statistics,
)


class LayeredMLP(Protocol):
    """What the decoder reads of ``recovery_w`` (a ``network.MLP``, which imports this
    module): its Linear and BatchNorm layers by position."""

    def linear_layer(self, i: int) -> nn.Linear: ...

    def norm_layer(self, i: int) -> WeightedBatchNorm1d: ...


def _first_activation(set_part, gene_part, part=None):
    """``relu(bn0(x))`` on the (set, gene) rows of the sets ``part`` (all when None): the
    normalised row is ``set_part[s] + gene_part[g]`` (``scale * (shifts - mean) + beta`` and
    ``scale * (genes - mean)``), built by broadcasting the two tables ((S * G) x H)."""
    sets = set_part if part is None else set_part[part]
    return torch.add(sets.unsqueeze(1), gene_part).relu_().view(-1, gene_part.shape[1])


def _pieces(n_sets: int, n_genes: int, device: torch.device) -> list[tuple[slice | None, slice | None]]:
    """The (sets, rows) slices of the pieces a row-wise pass goes through (``block_slices``);
    ``(None, None)`` for one piece of everything."""
    slices = block_slices(n_sets, n_genes, device)
    if len(slices) == 1:
        return [(None, None)]
    return [(sets, slice(sets.start * n_genes, sets.stop * n_genes)) for sets in slices]


class RowBuffers:
    """The decoder's row-sized buffers, kept by its network from one training step to the next.

    At 18,000 genes each is 100-300 MiB, above glibc's largest mmap threshold (32 MiB):
    allocated afresh, each step would map them and fault their pages in again (a large share
    of the step's time: benchmarks/RESULTS.md). A forward pass borrows them and its backward
    pass gives them back; a forward pass that finds them borrowed (a second forward pass
    before the first one's backward) gets buffers of its own. ``release`` frees them (the
    network does when it leaves training mode, so evaluation does not hold them), and a
    copy of the network (``copy.deepcopy``, pickling) starts with none."""

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}
        self.borrowed = False

    def borrow(self) -> "RowBuffers":
        """These buffers, marked borrowed, or new ones when they are borrowed already."""
        if self.borrowed:
            return RowBuffers()
        self.borrowed = True
        return self

    def give_back(self) -> None:
        self.borrowed = False

    def release(self) -> None:
        self._buffers.clear()

    def buffer(
        self, name: str, like: torch.Tensor, n_rows: int, capacity: int, width: int, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """An uninitialised (n_rows x width) tensor (``like``'s dtype unless ``dtype``, on its
        device) cut from the buffer ``name`` of ``capacity`` rows, made when there is none of
        that size yet (only the rows used are touched, so only they take memory)."""
        dtype = like.dtype if dtype is None else dtype
        kept = self._buffers.get(name)
        if kept is None or kept.shape != (capacity, width) or kept.dtype != dtype or kept.device != like.device:
            kept = self._buffers[name] = like.new_empty(capacity, width, dtype=dtype)
        return _first_rows(kept, n_rows)

    def __deepcopy__(self, memo) -> "RowBuffers":
        return RowBuffers()

    def __getstate__(self) -> dict:
        return {"_buffers": {}, "borrowed": False}  # a pickled network carries no buffers


def _row_buffer(
    buffers: RowBuffers | None,
    name: str,
    like: torch.Tensor,
    n_rows: int,
    capacity: int,
    width: int,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``buffers.buffer(...)``, or without ``buffers`` a new buffer of that size."""
    if buffers is None:
        return _first_rows(like.new_empty(capacity, width, dtype=dtype), n_rows)
    return buffers.buffer(name, like, n_rows, capacity, width, dtype)


def _first_rows(buffer: torch.Tensor, n_rows: int) -> torch.Tensor:
    return buffer if len(buffer) == n_rows else buffer[:n_rows]


def _inputs_buffer(
    buffers: RowBuffers | None,
    name: str,
    like: torch.Tensor,
    n_rows: int,
    capacity: int,
    width: int,
    matmul_dtype: torch.dtype,
):
    """Where a product's input rows are kept for the backward pass, in the product's precision,
    when that is not the rows' own (under autocast); None otherwise (the backward pass
    recomputes them)."""
    return (
        None if matmul_dtype == like.dtype else _row_buffer(buffers, name, like, n_rows, capacity, width, matmul_dtype)
    )


def _linear_into(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, kept: torch.Tensor | None
) -> None:
    """``out[:] = linear(x, weight, bias)``. With ``kept`` (a piece of ``_inputs_buffer``) ``x`` is
    cast into it and the product runs in its precision (``weight`` and ``bias`` given in it),
    as autocast runs a Linear; else straight into ``out``."""
    if kept is None:
        torch.addmm(bias, x, weight.T, out=out)
    else:
        out.copy_(torch.addmm(bias, kept.copy_(x), weight.T))


def _masked_mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, activated: torch.Tensor) -> None:
    """``out[:] = relu'(activated) * (a @ b)``: straight into ``out`` when the dtypes agree, else
    masked in the product's precision (``activated`` is in it) and cast into ``out``."""
    if a.dtype == out.dtype:
        relu_mask_(torch.mm(a, b, out=out), activated)
    else:
        out.copy_(relu_mask_(a.mm(b), activated))


@overload
def _part(tensor: torch.Tensor, part: slice | None) -> torch.Tensor: ...
@overload
def _part(tensor: None, part: slice | None) -> None: ...
@overload
def _part(tensor: torch.Tensor | None, part: slice | None) -> torch.Tensor | None: ...
def _part(tensor: torch.Tensor | None, part: slice | None) -> torch.Tensor | None:
    return tensor if part is None or tensor is None else tensor[part]


class _SetDecoder(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        genes,
        shifts,
        counts,
        n_cells: int,
        gamma0,
        beta0,
        weight1,
        bias1,
        gamma1,
        beta1,
        weight2,
        bias2,
        gamma2,
        beta2,
        out_weight,
        out_bias,
        eps: tuple[float, float, float],
        synchronize: bool,
        buffers: RowBuffers | None,
    ):
        ctx.input_dtypes = genes.dtype, shifts.dtype
        ctx.set_materialize_grads(False)  # the statistics' (absent) gradients need no zeros
        genes, shifts = full_precision(genes), full_precision(shifts)  # the tables' statistics, as for any row
        n_sets, n_genes = shifts.shape[0], genes.shape[0]
        # row buffers sized for one set per cell, which is constant from step to step
        n_rows, capacity = n_sets * n_genes, n_cells * n_genes
        pieces = _pieces(n_sets, n_genes, genes.device)
        # each set's share of the batch's cells, and each of its (set, gene) rows' share of all rows
        set_shares, cells = block_shares(counts, 1, genes.dtype, synchronize)
        shares = set_shares / n_genes
        weights = RowShares(shares, n_genes)
        # bn_pert_base, from the gene and set tables (the set rows weighted by their cells)
        gene_mean, gene_var = mean_and_variance(genes)
        genes_centred = genes - gene_mean
        shifts_centred, shift_mean, shift_var = weighted_moments(shifts, RowShares(set_shares, 1), synchronize)
        mean0, var0 = gene_mean + shift_mean, gene_var + shift_var
        invstd0 = torch.rsqrt(var0 + eps[0])
        scale0 = gamma0 * invstd0
        set_part, gene_part = torch.addcmul(beta0, shifts_centred, scale0), genes_centred * scale0
        # recovery_w: Linear, BatchNorm, ReLU, Linear, BatchNorm, a piece of rows at a time; each
        # BatchNorm's input centred in place. The products run as autocast runs them, their
        # inputs kept in their precision (``_inputs_buffer``)
        matmul_dtype = (
            torch.get_autocast_dtype(genes.device.type) if torch.is_autocast_enabled(genes.device.type) else genes.dtype
        )
        weight1_mm, bias1_mm, weight2_mm, bias2_mm = (t.to(matmul_dtype) for t in (weight1, bias1, weight2, bias2))
        z1 = _row_buffer(buffers, "centred1", genes, n_rows, capacity, weight1.shape[0])
        inputs1 = _inputs_buffer(buffers, "inputs1", genes, n_rows, capacity, weight1.shape[1], matmul_dtype)
        for sets, rows in pieces:
            _linear_into(
                _part(z1, rows),
                _first_activation(set_part, gene_part, sets),
                weight1_mm,
                bias1_mm,
                _part(inputs1, rows),
            )
        centred1, mean1, var1, invstd1 = weighted_statistics(z1, weights, eps[1], synchronize, in_place=True)
        z2 = _row_buffer(buffers, "centred2", genes, n_rows, capacity, weight2.shape[0])
        inputs2 = _inputs_buffer(buffers, "inputs2", genes, n_rows, capacity, weight2.shape[1], matmul_dtype)
        for _, rows in pieces:
            _linear_into(
                _part(z2, rows),
                relu_normalised(_part(centred1, rows), invstd1, gamma1, beta1),
                weight2_mm,
                bias2_mm,
                _part(inputs2, rows),
            )
        centred2, mean2, var2, invstd2 = weighted_statistics(z2, weights, eps[2], synchronize, in_place=True)
        # gene_out = (gamma2 * invstd2 * centred2 + beta2) . out_weight[g] + out_bias[g], in the rows' precision
        per_gene_weight, blocks2 = gamma2 * invstd2 * out_weight, blocks_of(centred2, n_sets)
        with torch.autocast(genes.device.type, enabled=False):
            gene_out = (
                torch.cat([torch.linalg.vecdot(_part(blocks2, sets), per_gene_weight, dim=-1) for sets, _ in pieces])
                if len(pieces) > 1
                else (blocks2 * per_gene_weight).sum(-1)
            )
        gene_out += torch.addmv(out_bias, out_weight, beta2)
        ctx.matmul_dtype = matmul_dtype
        ctx.synchronize, ctx.capacity, ctx.buffers, ctx.backward_done = synchronize, capacity, buffers, False
        ctx.save_for_backward(
            genes_centred,
            shifts_centred,
            set_part,
            gene_part,
            shares,
            invstd0,
            scale0,
            weight1,
            centred1,
            invstd1,
            gamma1,
            beta1,
            weight2,
            centred2,
            invstd2,
            gamma2,
            beta2,
            out_weight,
            inputs1,
            inputs2,
        )
        statistics = (mean0, var0, mean1, var1, mean2, var2, cells)
        ctx.mark_non_differentiable(*statistics)
        return (gene_out, *statistics)

    @staticmethod
    def backward(ctx, grad_out, *_):
        if ctx.backward_done:
            raise RuntimeError(
                "the fused GEARS decoder reuses its saved tensors in backward: backward through it "
                "can run once (no retain_graph)"
            )
        ctx.backward_done = True
        (
            genes_centred,
            shifts_centred,
            set_part,
            gene_part,
            share,
            invstd0,
            scale0,
            weight1,
            centred1,
            invstd1,
            gamma1,
            beta1,
            weight2,
            centred2,
            invstd2,
            gamma2,
            beta2,
            out_weight,
            inputs1,
            inputs2,
        ) = ctx.saved_tensors
        synchronize, matmul_dtype = ctx.synchronize, ctx.matmul_dtype
        n_sets, n_genes = shifts_centred.shape[0], genes_centred.shape[0]
        pieces = _pieces(n_sets, n_genes, grad_out.device)
        grad_out = grad_out.to(centred2.dtype)
        minus_shares = minus_block_shares(share)

        # output dot product and bn2: the gradient reaching bn2's output is grad_out[s, g] * out_weight[g]
        scale2 = gamma2 * invstd2
        blocks2, grad_rows_out = blocks_of(centred2, n_sets), grad_out.unsqueeze(-1)
        # pieces is never empty, so the sum is a tensor, not sum's start 0
        per_gene = cast(
            torch.Tensor, sum(first_dim_sum(_part(grad_rows_out, sets) * _part(blocks2, sets)) for sets, _ in pieces)
        )
        grad_out_bias = grad_out.sum(0)
        grad_out_weight = torch.addcmul(torch.outer(grad_out_bias, beta2), per_gene, scale2)
        local_beta2, local_gamma2 = torch.mv(out_weight.T, grad_out_bias), (out_weight * per_gene).sum(0) * invstd2
        grad_beta2, grad_gamma2 = summed_over_ranks([local_beta2, local_gamma2], synchronize)
        # bn2's input gradient, in place of centred2: scale2 * g - share * (scale2 * dbeta + centred * c)
        grad_z2 = statistics_gradient(centred2, minus_shares, scale2, invstd2, grad_gamma2, grad_beta2, in_place=True)
        blocks_of(grad_z2, n_sets).addcmul_(grad_rows_out, scale2 * out_weight)

        # second Linear, then ReLU (its output kept, or recomputed a piece at a time) and bn1
        grad_a1 = _row_buffer(ctx.buffers, "grad_a1", centred1, len(centred1), ctx.capacity, centred1.shape[1])
        grad_weight2 = _linear_backward(
            grad_z2,
            grad_a1,
            weight2,
            pieces,
            matmul_dtype,
            lambda sets, rows: (
                _part(inputs2, rows)
                if inputs2 is not None
                else relu_normalised(_part(centred1, rows), invstd1, gamma1, beta1)
            ),
        )
        grad_bias2 = first_dim_sum(grad_z2).to(weight2.dtype)
        grad_z1, grad_gamma1, grad_beta1 = normalisation_backward(
            grad_a1, centred1, minus_shares, invstd1, gamma1, synchronize, in_place=True
        )
        del grad_a1

        # first Linear, then ReLU and bn0 (through the gene and set tables); the gradient at
        # bn0's output goes where grad_z2 was
        grad_weight1 = _linear_backward(
            grad_z1,
            grad_z2,
            weight1,
            pieces,
            matmul_dtype,
            lambda sets, rows: (
                _part(inputs1, rows) if inputs1 is not None else _first_activation(set_part, gene_part, sets)
            ),
        )
        grad_bias1 = first_dim_sum(grad_z1).to(weight1.dtype)
        grad_a0 = blocks_of(grad_z2, n_sets)
        over_sets, over_genes = grad_a0.sum(0), grad_a0.sum(1)  # G x H, S x H
        local_beta0 = over_sets.sum(0)
        local_gamma0 = (column_dot(over_sets, genes_centred) + column_dot(over_genes, shifts_centred)) * invstd0
        grad_beta0, grad_gamma0 = summed_over_ranks([local_beta0, local_gamma0], synchronize)
        # d x[s, g] = scale0 * (g - share_s * (dbeta + xhat * dgamma)), summed over sets / over genes. (The
        # sum over sets drops share @ shifts_centred: zero over all ranks' sets, and the gene tables, the same
        # on every rank, get the sum of the ranks' gradients.)
        slope = grad_gamma0 * invstd0
        grad_genes = scale0 * (over_sets - share.sum() * torch.addcmul(grad_beta0, slope, genes_centred))
        grad_shifts = scale0 * torch.addcmul(
            over_genes, n_genes * minus_shares.view(-1, 1), torch.addcmul(grad_beta0, slope, shifts_centred)
        )
        if ctx.buffers is not None:
            ctx.buffers.give_back()
        return (
            grad_genes.to(ctx.input_dtypes[0]),
            grad_shifts.to(ctx.input_dtypes[1]),
            None,
            None,
            local_gamma0,
            local_beta0,
            grad_weight1,
            grad_bias1,
            grad_gamma1,
            grad_beta1,
            grad_weight2,
            grad_bias2,
            local_gamma2,
            local_beta2,
            grad_out_weight,
            grad_out_bias,
            None,
            None,
            None,
        )


def _linear_backward(grad, grad_input, weight, pieces, matmul_dtype, input_of):
    """Backward of a Linear followed by the ReLU that made its input, a piece of rows at a
    time: writes ``relu'(input) * (grad @ weight)`` into ``grad_input`` and returns the weight
    gradient ``grad.T @ input`` (summed over the pieces in float32 at least).
    ``input_of(sets, rows)`` gives a piece's input (the ReLU's output): kept in ``matmul_dtype``
    by the forward pass, or recomputed in the rows' own dtype when that is ``matmul_dtype``."""
    matmul_weight = weight.to(matmul_dtype)
    total: torch.Tensor | None = None
    for sets, rows in pieces:
        activated = input_of(sets, rows)
        grad_rows = _part(grad, rows).to(matmul_dtype)
        piece = grad_rows.T.mm(activated)
        total = full_precision(piece) if total is None else total.add_(piece)
        _masked_mm_into(_part(grad_input, rows), grad_rows, matmul_weight, activated)
    return cast(torch.Tensor, total).to(weight.dtype)  # pieces is never empty: a total was made


def decode_sets(
    genes,
    shifts,
    counts,
    n_cells: int,
    bn_pert_base: WeightedBatchNorm1d,
    recovery_w: LayeredMLP,
    out_weight,
    out_bias,
    synchronize: bool,
    buffers: RowBuffers | None = None,
):
    """Training-mode ``gene_out`` (S x G) of the per-set rows ``genes[g] + shifts[s]`` (see the
    module docstring) of a batch of ``n_cells`` cells (``counts.sum()``); updates the three
    BatchNorms' running statistics. ``buffers``: the row buffers kept between steps
    (``RowBuffers``); used only when a backward pass will give them back (gradients on), not
    while compiling (the compiler traces no side effects) and not while a CUDA graph is
    captured (its buffers must come from the graph's own memory, which outlives their
    release), else the pass makes its own."""
    norm0, linear1, norm1 = bn_pert_base, recovery_w.linear_layer(0), recovery_w.norm_layer(1)
    linear2, norm2 = recovery_w.linear_layer(3), recovery_w.norm_layer(4)
    # the CUDA runtime is asked about a capture last: never while torch.compile traces this
    keep = (
        buffers is not None
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and not (genes.device.type == "cuda" and torch.cuda.is_current_stream_capturing())
    )
    gene_out, mean0, var0, mean1, var1, mean2, var2, cells = _SetDecoder.apply(
        genes,
        shifts,
        counts,
        n_cells,
        norm0.weight,
        norm0.bias,
        linear1.weight,
        linear1.bias,
        norm1.weight,
        norm1.bias,
        linear2.weight,
        linear2.bias,
        norm2.weight,
        norm2.bias,
        out_weight,
        out_bias,
        (norm0.eps, norm1.eps, norm2.eps),
        synchronize,
        buffers.borrow() if keep and buffers is not None else None,
    )
    rows_stood = cells * genes.shape[0] if synchronize else n_cells * genes.shape[0]
    update_running_statistics([norm0, norm1, norm2], [mean0, mean1, mean2], [var0, var1, var2], rows_stood)
    return gene_out
