"""GEARS's per-gene decoder over (perturbation set, gene) rows in training mode, as one
autograd function.

For each distinct perturbation set ``s`` (``counts[s]`` cells) and gene ``g`` the model
computes, on the row ``x[s, g] = genes[g] + shifts[s]``::

    decoded = bn2(lin2(relu(bn1(lin1(relu(bn0(x)))))))      # bn_pert_base, recovery_w
    gene_out[s, g] = decoded[s, g] . out_weight[g] + out_bias[g]   # indv_w1, indv_b1

with training-mode BatchNorm statistics over all rows weighted by ``counts``. This is the
bulk of a training step (S x G rows), and autograd's module-by-module chain spends most of
it allocating and re-reading row-sized tensors. Here:

- ``bn0``'s statistics come from the two small tables: over the (set, gene) grid the gene
  and set terms are independent, so the mean is ``mean(genes) + mean(shifts)`` and the
  variance ``var(genes) + var(shifts)``; its backward needs only the row gradient's sums
  over sets and over genes. Its input rows are never materialised.
- ``bn2`` followed by the dot product with ``out_weight`` is one vector product per row.
- Only the centred inputs of ``bn1`` and ``bn2`` are kept for the backward pass; the ReLU
  outputs are recomputed there, and the normalisation backward passes overwrite those
  centred tensors in place (so the backward pass can run once, not with ``retain_graph``).
- The row-sized tensors are three buffers (``bn1``'s centred input, then its gradient;
  ``bn1``'s output gradient; ``bn2``'s centred input, then its gradient, then ``bn0``'s
  output gradient, which has the same width in GEARS), each allocated at a size that does
  not change from step to step. Everything else runs a piece of rows at a time
  (``rows_per_pass``: about 4,096 on a CPU, so its temporaries stay small and the step's
  live memory is those buffers; about a million on a GPU, where each piece costs kernel
  launches).

Outputs and gradients are those of the module chain (the test suite compares them in
float64). With ``synchronize`` (distributed ``sync_batchnorm``) the statistics and the
backward sums run over the rows of all ranks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gears_ddp.model.weighted_norm import (all_reduce_if, block_slices, blocks_of, full_precision, normalisation_backward,
                                     relu_mask_, relu_normalised, statistics_gradient, weighted_statistics)


def _first_activation(genes_centred, shifts_centred, scale, beta):
    """``relu(bn0(x))`` on the (set, gene) rows of the given sets: ``scale * (genes - mean) +
    scale * (shifts - mean) + beta``, built by broadcasting the two tables ((S * G) x H)."""
    activated = torch.add((shifts_centred * scale + beta).unsqueeze(1), (genes_centred * scale).unsqueeze(0))
    return activated.relu_().view(-1, genes_centred.shape[1])


def _pieces(n_sets: int, n_genes: int, device: torch.device) -> list[tuple[slice, slice]]:
    """The (sets, rows) slices of the pieces a row-wise pass goes through (``block_slices``)."""
    return [(sets, slice(sets.start * n_genes, sets.stop * n_genes))
            for sets in block_slices(n_sets, n_genes, device)]


def _row_buffer(like: torch.Tensor, n_rows: int, capacity: int, width: int) -> torch.Tensor:
    """An uninitialised (n_rows x width) tensor cut from one of ``capacity`` rows, so that
    the allocation has the same size every step whatever the number of distinct sets: the
    allocator can then reuse the previous step's block (only the rows used are touched, so
    only they take memory)."""
    return like.new_empty(capacity, width)[:n_rows]


def _linear_into(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    """``out[:] = linear(x, weight, bias)``, computed as autocast computes it when enabled
    (then cast into ``out``), else straight into ``out``."""
    if torch.is_autocast_enabled(x.device.type):
        out.copy_(F.linear(x, weight, bias))
    else:
        torch.addmm(bias, x, weight.T, out=out)


def _mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out[:] = a @ b`` (straight into ``out`` when the dtypes agree)."""
    if a.dtype == out.dtype:
        torch.mm(a, b, out=out)
    else:
        out.copy_(a.mm(b))


class _SetDecoder(torch.autograd.Function):
    @staticmethod
    def forward(ctx, genes, shifts, counts, n_cells: int, gamma0, beta0, weight1, bias1, gamma1, beta1, weight2,
                bias2, gamma2, beta2, out_weight, out_bias, eps: tuple[float, float, float], synchronize: bool):
        ctx.input_dtypes = genes.dtype, shifts.dtype
        genes, shifts = full_precision(genes), full_precision(shifts)  # the tables' statistics, as for any row
        (n_sets, n_genes), weight = (shifts.shape[0], genes.shape[0]), counts.to(genes.dtype)
        # row buffers sized for one set per cell, which is constant from step to step
        n_rows, capacity = n_sets * n_genes, n_cells * n_genes
        pieces = _pieces(n_sets, n_genes, genes.device)
        # bn_pert_base, from the gene and set tables (the set rows weighted by their cells)
        genes_centred = genes - genes.mean(0)
        shifts_centred, _, _, shift_mean, shift_var, n_cells = weighted_statistics(shifts, counts, eps[0],
                                                                                   synchronize)
        mean0 = genes.mean(0) + shift_mean
        var0 = (genes_centred * genes_centred).mean(0) + shift_var
        invstd0 = torch.rsqrt(var0 + eps[0])
        scale0 = gamma0 * invstd0
        # recovery_w: Linear, BatchNorm, ReLU, Linear, BatchNorm, a piece of rows at a time; each
        # BatchNorm's input centred in place
        z1 = _row_buffer(genes, n_rows, capacity, weight1.shape[0])
        for sets, rows in pieces:
            _linear_into(z1[rows], _first_activation(genes_centred, shifts_centred[sets], scale0, beta0), weight1,
                         bias1)
        centred1, _, invstd1, mean1, var1, n_rows_stood = weighted_statistics(z1, counts, eps[1], synchronize,
                                                                              in_place=True)
        z2 = _row_buffer(genes, n_rows, capacity, weight2.shape[0])
        for _, rows in pieces:
            _linear_into(z2[rows], relu_normalised(centred1[rows], invstd1, gamma1, beta1), weight2, bias2)
        centred2, _, invstd2, mean2, var2, _ = weighted_statistics(z2, counts, eps[2], synchronize, in_place=True)
        # gene_out = (gamma2 * invstd2 * centred2 + beta2) . out_weight[g] + out_bias[g]
        per_gene_weight, blocks2 = gamma2 * invstd2 * out_weight, blocks_of(centred2, n_sets)
        gene_out = torch.cat([torch.linalg.vecdot(blocks2[sets], per_gene_weight, dim=-1) for sets, _ in pieces])
        gene_out += out_weight @ beta2 + out_bias
        ctx.matmul_dtype = (torch.get_autocast_dtype(genes.device.type)
                            if torch.is_autocast_enabled(genes.device.type) else genes.dtype)
        ctx.synchronize, ctx.capacity, ctx.backward_done = synchronize, capacity, False
        ctx.save_for_backward(genes_centred, shifts_centred, weight, n_cells, invstd0, gamma0, beta0, weight1,
                              centred1, invstd1, gamma1, beta1, weight2, centred2, invstd2, gamma2, beta2, out_weight)
        statistics = (mean0, var0, mean1, var1, mean2, var2, n_rows_stood)
        ctx.mark_non_differentiable(*statistics)
        return (gene_out, *statistics)

    @staticmethod
    def backward(ctx, grad_out, *_):
        if ctx.backward_done:
            raise RuntimeError("the fused GEARS decoder reuses its saved tensors in backward: backward through it "
                               "can run once (no retain_graph)")
        ctx.backward_done = True
        (genes_centred, shifts_centred, weight, n_cells, invstd0, gamma0, beta0, weight1, centred1, invstd1, gamma1,
         beta1, weight2, centred2, invstd2, gamma2, beta2, out_weight) = ctx.saved_tensors
        synchronize, matmul_dtype = ctx.synchronize, ctx.matmul_dtype
        n_sets, n_genes = shifts_centred.shape[0], genes_centred.shape[0]
        pieces = _pieces(n_sets, n_genes, grad_out.device)
        share = weight / (n_cells * n_genes)  # each row's share of the rows stood for
        grad_out = grad_out.to(centred2.dtype)

        # output dot product and bn2: the gradient reaching bn2's output is grad_out[s, g] * out_weight[g]
        scale2 = gamma2 * invstd2
        blocks2 = blocks_of(centred2, n_sets)
        per_gene = sum((grad_out[sets].unsqueeze(-1) * blocks2[sets]).sum(0) for sets, _ in pieces)
        grad_out_bias = grad_out.sum(0)
        grad_out_weight = scale2 * per_gene + grad_out_bias.unsqueeze(1) * beta2
        local2 = torch.stack([grad_out_bias @ out_weight, (out_weight * per_gene).sum(0) * invstd2])
        grad_beta2, grad_gamma2 = all_reduce_if(local2.clone(), synchronize)
        # bn2's input gradient, in place of centred2: scale2 * g - share * (scale2 * dbeta + centred * c)
        grad_z2 = statistics_gradient(centred2, share.view(-1, 1, 1), scale2, invstd2, grad_gamma2, grad_beta2,
                                      in_place=True)
        blocks_of(grad_z2, n_sets).addcmul_(grad_out.unsqueeze(-1), scale2 * out_weight)

        # second Linear, then ReLU (its output recomputed a piece at a time) and bn1
        # the weight gradients are summed over the pieces (in float32 at least)
        grad_weight2 = torch.zeros_like(weight2, dtype=torch.promote_types(weight2.dtype, torch.float32))
        grad_a1 = _row_buffer(centred1, len(centred1), ctx.capacity, centred1.shape[1])
        matmul_weight2 = weight2.to(matmul_dtype)
        for _, rows in pieces:
            activated1 = relu_normalised(centred1[rows], invstd1, gamma1, beta1)
            grad_rows = grad_z2[rows].to(matmul_dtype)
            grad_weight2 += grad_rows.T.mm(activated1.to(matmul_dtype))
            _mm_into(grad_a1[rows], grad_rows, matmul_weight2)
            relu_mask_(grad_a1[rows], activated1)
        grad_bias2 = grad_z2.sum(0).to(weight2.dtype)
        grad_z1, grad_gamma1, grad_beta1 = normalisation_backward(grad_a1, centred1, share.view(-1, 1, 1), invstd1,
                                                                  gamma1, synchronize, in_place=True)
        del grad_a1

        # first Linear, then ReLU and bn0 (through the gene and set tables); the gradient at
        # bn0's output goes where grad_z2 was
        scale0 = gamma0 * invstd0
        grad_weight1 = torch.zeros_like(weight1, dtype=grad_weight2.dtype)
        grad_a0, matmul_weight1 = grad_z2, weight1.to(matmul_dtype)
        for sets, rows in pieces:
            activated0 = _first_activation(genes_centred, shifts_centred[sets], scale0, beta0)
            grad_rows = grad_z1[rows].to(matmul_dtype)
            grad_weight1 += grad_rows.T.mm(activated0.to(matmul_dtype))
            _mm_into(grad_a0[rows], grad_rows, matmul_weight1)
            relu_mask_(grad_a0[rows], activated0)
        grad_bias1 = grad_z1.sum(0).to(weight1.dtype)
        grad_a0 = blocks_of(grad_a0, n_sets)
        over_sets, over_genes = grad_a0.sum(0), grad_a0.sum(1)  # G x H, S x H
        local0 = torch.stack([over_sets.sum(0), ((over_sets * genes_centred).sum(0)
                                                 + (over_genes * shifts_centred).sum(0)) * invstd0])
        grad_beta0, grad_gamma0 = all_reduce_if(local0.clone(), synchronize)
        # d x[s, g] = scale0 * (g - share_s * (dbeta + xhat * dgamma)), summed over sets / over genes. (The
        # sum over sets drops share @ shifts_centred: zero over all ranks' sets, and the gene tables, the same
        # on every rank, get the sum of the ranks' gradients.)
        slope = grad_gamma0 * invstd0
        grad_genes = scale0 * (over_sets - share.sum() * (grad_beta0 + slope * genes_centred))
        grad_shifts = scale0 * (over_genes - (n_genes * share).unsqueeze(1) * (grad_beta0 + slope * shifts_centred))
        return (grad_genes.to(ctx.input_dtypes[0]), grad_shifts.to(ctx.input_dtypes[1]), None, None, local0[1], local0[0],
                grad_weight1.to(weight1.dtype), grad_bias1, grad_gamma1, grad_beta1, grad_weight2.to(weight2.dtype),
                grad_bias2, local2[1], local2[0], grad_out_weight, grad_out_bias, None, None)


def decode_sets(genes, shifts, counts, n_cells: int, bn_pert_base, recovery_w, out_weight, out_bias,
                synchronize: bool):
    """Training-mode ``gene_out`` (S x G) of the per-set rows ``genes[g] + shifts[s]`` (see the
    module docstring) of a batch of ``n_cells`` cells (``counts.sum()``); updates the three
    BatchNorms' running statistics."""
    norm0, linear1, norm1, _, linear2, norm2 = bn_pert_base, *recovery_w.network
    gene_out, mean0, var0, mean1, var1, mean2, var2, n_rows = _SetDecoder.apply(
        genes, shifts, counts, n_cells, norm0.weight, norm0.bias, linear1.weight, linear1.bias, norm1.weight, norm1.bias,
        linear2.weight, linear2.bias, norm2.weight, norm2.bias, out_weight, out_bias, (norm0.eps, norm1.eps, norm2.eps),
        synchronize)
    for norm, mean, var in ((norm0, mean0, var0), (norm1, mean1, var1), (norm2, mean2, var2)):
        norm.update_running_stats(mean, var, n_rows)
    return gene_out
