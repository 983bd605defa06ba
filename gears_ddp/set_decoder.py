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

Outputs and gradients are those of the module chain (the test suite compares them in
float64). With ``synchronize`` (distributed ``sync_batchnorm``) the statistics and the
backward sums run over the rows of all ranks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gears_ddp.weighted_norm import (all_reduce_if, blocks_of, full_precision, normalisation_backward,
                                     relu_mask_, relu_normalised, statistics_gradient, weighted_statistics)


def _first_activation(genes_centred, shifts_centred, scale, beta):
    """``relu(bn0(x))`` on every (set, gene) row: ``scale * (genes - mean) + scale * (shifts
    - mean) + beta``, built by broadcasting the two tables ((S * G) x H)."""
    activated = torch.add((shifts_centred * scale + beta).unsqueeze(1), (genes_centred * scale).unsqueeze(0))
    return activated.relu_().view(-1, genes_centred.shape[1])


class _SetDecoder(torch.autograd.Function):
    @staticmethod
    def forward(ctx, genes, shifts, counts, gamma0, beta0, weight1, bias1, gamma1, beta1, weight2, bias2,
                gamma2, beta2, out_weight, out_bias, eps: tuple[float, float, float], synchronize: bool):
        ctx.input_dtypes = genes.dtype, shifts.dtype
        genes, shifts = full_precision(genes), full_precision(shifts)  # the tables' statistics, as for any row
        n_sets, weight = shifts.shape[0], counts.to(genes.dtype)
        # bn_pert_base, from the gene and set tables (the set rows weighted by their cells)
        genes_centred = genes - genes.mean(0)
        shifts_centred, _, _, shift_mean, shift_var, n_cells = weighted_statistics(shifts, counts, eps[0],
                                                                                   synchronize)
        mean0 = genes.mean(0) + shift_mean
        var0 = (genes_centred * genes_centred).mean(0) + shift_var
        invstd0 = torch.rsqrt(var0 + eps[0])
        # recovery_w: Linear, BatchNorm, ReLU, Linear, BatchNorm; each BatchNorm's input centred in place
        z1 = F.linear(_first_activation(genes_centred, shifts_centred, gamma0 * invstd0, beta0), weight1, bias1)
        ctx.matmul_dtype = z1.dtype
        centred1, _, invstd1, mean1, var1, n_rows = weighted_statistics(z1, counts, eps[1], synchronize, in_place=True)
        z2 = F.linear(relu_normalised(centred1, invstd1, gamma1, beta1), weight2, bias2)
        centred2, _, invstd2, mean2, var2, _ = weighted_statistics(z2, counts, eps[2], synchronize, in_place=True)
        # gene_out = (gamma2 * invstd2 * centred2 + beta2) . out_weight[g] + out_bias[g]
        gene_out = torch.linalg.vecdot(blocks_of(centred2, n_sets), gamma2 * invstd2 * out_weight, dim=-1)
        gene_out += out_weight @ beta2 + out_bias
        ctx.synchronize, ctx.backward_done = synchronize, False
        ctx.save_for_backward(genes_centred, shifts_centred, weight, n_cells, invstd0, gamma0, beta0, weight1,
                              centred1, invstd1, gamma1, beta1, weight2, centred2, invstd2, gamma2, beta2, out_weight)
        statistics = (mean0, var0, mean1, var1, mean2, var2, n_rows)
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
        share = weight / (n_cells * n_genes)  # each row's share of the rows stood for
        grad_out = grad_out.to(centred2.dtype)

        # output dot product and bn2: the gradient reaching bn2's output is grad_out[s, g] * out_weight[g]
        scale2 = gamma2 * invstd2
        per_gene = (grad_out.unsqueeze(-1) * blocks_of(centred2, n_sets)).sum(0)  # sum_s grad_out * centred2
        grad_out_bias = grad_out.sum(0)
        grad_out_weight = scale2 * per_gene + grad_out_bias.unsqueeze(1) * beta2
        local2 = torch.stack([grad_out_bias @ out_weight, (out_weight * per_gene).sum(0) * invstd2])
        grad_beta2, grad_gamma2 = all_reduce_if(local2.clone(), synchronize)
        # bn2's input gradient, in place of centred2: scale2 * g - share * (scale2 * dbeta + centred * c)
        grad_z2 = statistics_gradient(centred2, share.view(-1, 1, 1), scale2, invstd2, grad_gamma2, grad_beta2,
                                      in_place=True)
        blocks_of(grad_z2, n_sets).addcmul_(grad_out.unsqueeze(-1), scale2 * out_weight)

        # second Linear, then ReLU and bn1
        activated1 = relu_normalised(centred1, invstd1, gamma1, beta1)
        grad_z2 = grad_z2.to(matmul_dtype)
        grad_weight2 = grad_z2.T.mm(activated1.to(matmul_dtype)).to(weight2.dtype)
        grad_bias2 = grad_z2.sum(0).to(weight2.dtype)
        grad_a1 = relu_mask_(grad_z2.mm(weight2.to(matmul_dtype)).to(centred1.dtype), activated1)
        del activated1, grad_z2
        grad_z1, grad_gamma1, grad_beta1 = normalisation_backward(grad_a1, centred1, share.view(-1, 1, 1), invstd1,
                                                                  gamma1, synchronize, in_place=True)
        del grad_a1

        # first Linear, then ReLU and bn0 (through the gene and set tables)
        scale0 = gamma0 * invstd0
        activated0 = _first_activation(genes_centred, shifts_centred, scale0, beta0)
        grad_z1 = grad_z1.to(matmul_dtype)
        grad_weight1 = grad_z1.T.mm(activated0.to(matmul_dtype)).to(weight1.dtype)
        grad_bias1 = grad_z1.sum(0).to(weight1.dtype)
        grad_a0 = blocks_of(relu_mask_(grad_z1.mm(weight1.to(matmul_dtype)).to(genes_centred.dtype), activated0),
                            n_sets)
        del activated0, grad_z1
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
        return (grad_genes.to(ctx.input_dtypes[0]), grad_shifts.to(ctx.input_dtypes[1]), None, local0[1], local0[0],
                grad_weight1, grad_bias1, grad_gamma1, grad_beta1, grad_weight2, grad_bias2, local2[1], local2[0],
                grad_out_weight, grad_out_bias, None, None)


def decode_sets(genes, shifts, counts, bn_pert_base, recovery_w, out_weight, out_bias, synchronize: bool):
    """Training-mode ``gene_out`` (S x G) of the per-set rows ``genes[g] + shifts[s]`` (see the
    module docstring); updates the three BatchNorms' running statistics."""
    norm0, linear1, norm1, _, linear2, norm2 = bn_pert_base, *recovery_w.network
    gene_out, mean0, var0, mean1, var1, mean2, var2, n_rows = _SetDecoder.apply(
        genes, shifts, counts, norm0.weight, norm0.bias, linear1.weight, linear1.bias, norm1.weight, norm1.bias,
        linear2.weight, linear2.bias, norm2.weight, norm2.bias, out_weight, out_bias, (norm0.eps, norm1.eps, norm2.eps),
        synchronize)
    for norm, mean, var in ((norm0, mean0, var0), (norm1, mean1, var1), (norm2, mean2, var2)):
        norm.update_running_stats(mean, var, n_rows)
    return gene_out
