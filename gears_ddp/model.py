"""The GEARS network: tensors in, tensors out (no I/O, no devices, no ranks).

Parameter names, shapes and initialisation are those of the published ``GEARS_Model``, so
state dicts load both ways with ``strict=True``. The mathematics is the same; the work is
not:

- The per-gene part (gene embedding, ``bn_emb``, co-expression GNN, ``emb_trans_v2``) and
  the GO GNN over the perturbation vocabulary are computed once per batch, not on B x G
  repeated rows. (The published model also runs its co-expression GNN on B x G rows with
  an edge index over G nodes only, so only the first cell of a batch receives the
  co-expression messages; here every cell does, which is the model the paper describes.
  At batch size 1 the two agree.)
- Everything before ``+ x`` depends only on a cell's set of perturbed genes. It is computed
  once per distinct set in the batch; every BatchNorm that the published model runs over
  per-cell rows is given each set's cell count as a row weight, so its batch statistics,
  running statistics, outputs and gradients equal the per-cell computation. In evaluation
  mode a batch of one condition costs one pass.
- On those per-set rows, each BatchNorm -> ReLU -> Linear step is one autograd function
  that keeps only the centred input for the backward pass and recomputes the activation
  there, and the backward passes work in place: a training step's peak memory is about a
  quarter lower than with autograd's unfused chain.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gears_ddp.graph_conv import SimpleGraphConv

PERT_EMB_LAMBDA = 0.2  # weight of the co-expression (positional) embedding


def _weighted_statistics(x, row_weight, eps: float, synchronize: bool):
    """Count-weighted batch statistics of the rows of ``x`` (float32 for half inputs, as
    autocast does for BatchNorm: half-precision sums over many rows overflow).

    Returns ``centred = x - mean``, each row's ``share = w / sum(w)`` (a column), ``invstd``,
    and ``mean``, the biased ``var`` and ``total = sum(w)``. With ``synchronize`` the sums
    run over the rows of all ranks.
    """
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    weight = row_weight.to(x.dtype).unsqueeze(1)
    sums = torch.cat([weight.sum(0), weight.T.mm(x).squeeze(0)])
    if synchronize:
        dist.all_reduce(sums)
    total, mean = sums[0], sums[1:] / sums[0]
    centred = x - mean
    var = weight.T.mm(centred * centred).squeeze(0)
    if synchronize:
        dist.all_reduce(var)
    var = var / total
    return centred, weight / total, torch.rsqrt(var + eps), mean, var, total


def _normalisation_backward(grad, centred, share, invstd, gamma, synchronize: bool):
    """Gradients of ``gamma * centred * invstd + beta`` through the weighted statistics:
    ``dx = gamma * invstd * (g - share * (sum g + xhat * sum g xhat))``, where each row's
    gradient is already the sum over the identical copies it stands for. Returns
    ``(dx, dgamma, dbeta)``; with ``synchronize`` the sums run over all ranks' rows."""
    grad = grad.to(centred.dtype)
    normalised = centred * invstd
    local = torch.stack([grad.sum(0), (grad * normalised).sum(0)])
    reduced = local.clone()
    if synchronize:
        dist.all_reduce(reduced)
    # in place on one row-sized buffer: the backward pass's peak memory is in these passes
    grad_x = normalised.mul_(reduced[1]).add_(reduced[0]).mul_(share).neg_().add_(grad).mul_(invstd * gamma)
    return grad_x, local[1], local[0]


class _WeightedBatchNorm(torch.autograd.Function):
    """Training-mode BatchNorm over count-weighted rows, with its analytic backward: a few
    fused passes instead of autograd's chain of elementwise operations."""

    @staticmethod
    def forward(ctx, x, row_weight, gamma, beta, eps: float, synchronize: bool):
        ctx.input_dtype, ctx.synchronize = x.dtype, synchronize
        centred, share, invstd, mean, var, total = _weighted_statistics(x, row_weight, eps, synchronize)
        ctx.save_for_backward(centred, share, invstd, gamma)
        ctx.mark_non_differentiable(mean, var, total)
        return torch.addcmul(beta, centred, invstd * gamma), mean, var, total

    @staticmethod
    def backward(ctx, grad, *_):
        centred, share, invstd, gamma = ctx.saved_tensors
        grad_x, grad_gamma, grad_beta = _normalisation_backward(grad, centred, share, invstd, gamma,
                                                                ctx.synchronize)
        return grad_x.to(ctx.input_dtype), None, grad_gamma, grad_beta, None, None


class _WeightedBatchNormReluLinear(torch.autograd.Function):
    """``linear(relu(weighted BatchNorm(x)))`` that keeps only the centred input for the
    backward pass and recomputes the activation there.

    Unfused, autograd keeps the centred input, the ReLU output and (the same tensor) the
    Linear's input; for the per-set rows (S x G of them) that is the bulk of a training
    step's memory. Under autocast the Linear runs as autocast runs it (its output's dtype
    is recorded and the backward products use it).
    """

    @staticmethod
    def _activation(centred, invstd, gamma, beta):
        """relu(BatchNorm output): computed in forward, recomputed the same way in backward."""
        return torch.addcmul(beta, centred, invstd * gamma).relu_()

    @staticmethod
    def forward(ctx, x, row_weight, gamma, beta, eps: float, synchronize: bool, weight, bias):
        ctx.input_dtype, ctx.synchronize = x.dtype, synchronize
        centred, share, invstd, mean, var, total = _weighted_statistics(x, row_weight, eps, synchronize)
        out = F.linear(_WeightedBatchNormReluLinear._activation(centred, invstd, gamma, beta), weight, bias)
        ctx.matmul_dtype = out.dtype
        ctx.save_for_backward(centred, share, invstd, gamma, beta, weight, bias)
        ctx.mark_non_differentiable(mean, var, total)
        return out, mean, var, total

    @staticmethod
    def backward(ctx, grad, *_):
        centred, share, invstd, gamma, beta, weight, bias = ctx.saved_tensors
        activated = _WeightedBatchNormReluLinear._activation(centred, invstd, gamma, beta)
        grad = grad.to(ctx.matmul_dtype)
        grad_weight = grad.T.mm(activated.to(ctx.matmul_dtype)).to(weight.dtype)
        grad_bias = grad.sum(0).to(bias.dtype)
        inactive = activated <= 0
        del activated  # row-sized: freed before the next row-sized buffers
        grad_activated = grad.mm(weight.to(ctx.matmul_dtype)).to(centred.dtype).masked_fill_(inactive, 0)
        grad_x, grad_gamma, grad_beta = _normalisation_backward(grad_activated, centred, share, invstd, gamma,
                                                                ctx.synchronize)
        return grad_x.to(ctx.input_dtype), None, grad_gamma, grad_beta, None, None, grad_weight, grad_bias


class WeightedBatchNorm1d(nn.BatchNorm1d):
    """``BatchNorm1d`` whose training-mode statistics can weight rows by a count.

    A row with weight ``w`` counts as ``w`` identical rows: mean, biased variance (used to
    normalise) and the unbiased variance fed to the running estimate are those of the
    expanded batch. Without weights, or in evaluation mode, it is ``BatchNorm1d``.

    With ``synchronize`` set (distributed ``sync_batchnorm``), weighted statistics are those
    of the batches of all ranks together. (Rows without weights are the per-gene part,
    identical on every rank: nothing to synchronise.)
    """

    synchronize = False

    def forward(self, x: torch.Tensor, row_weight: torch.Tensor | None = None) -> torch.Tensor:
        if row_weight is None or not self.training:
            return super().forward(x)
        out, mean, var, total = _WeightedBatchNorm.apply(x, row_weight, self.weight, self.bias, self.eps,
                                                         self._synchronizing())
        self._update_running_stats(mean, var, total)
        return out

    def relu_linear(self, x: torch.Tensor, row_weight: torch.Tensor | None, linear: nn.Linear) -> torch.Tensor:
        """``linear(relu(self(x, row_weight)))``; with row weights in training mode, fused so
        that the backward pass keeps one tensor of ``x``'s size instead of three."""
        if row_weight is None or not self.training:
            return linear(F.relu(self(x, row_weight)))
        out, mean, var, total = _WeightedBatchNormReluLinear.apply(
            x, row_weight, self.weight, self.bias, self.eps, self._synchronizing(), linear.weight, linear.bias)
        self._update_running_stats(mean, var, total)
        return out

    def _synchronizing(self) -> bool:
        return self.synchronize and dist.is_initialized()

    @torch.no_grad()
    def _update_running_stats(self, mean, var, n_rows) -> None:
        if not self.track_running_stats:
            return
        self.num_batches_tracked.add_(1)
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        unbiased = var * (n_rows / (n_rows - 1)) if n_rows > 1 else var
        self.running_mean.mul_(1 - factor).add_(factor * mean.to(self.running_mean.dtype))
        self.running_var.mul_(1 - factor).add_(factor * unbiased.to(self.running_var.dtype))


class MLP(nn.Module):
    """``network`` = per step Linear, BatchNorm1d, ReLU, without the final ReLU (the
    published module layout, so the ``network.{i}`` names match)."""

    def __init__(self, sizes: list[int]):
        super().__init__()
        layers: list[nn.Module] = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(n_in, n_out), WeightedBatchNorm1d(n_out), nn.ReLU()]
        self.network = nn.Sequential(*layers[:-1])

    def forward(self, x: torch.Tensor, row_weight: torch.Tensor | None = None) -> torch.Tensor:
        return self.after_first_linear(self.network[0](x), row_weight)

    def after_first_linear(self, x: torch.Tensor, row_weight: torch.Tensor | None = None) -> torch.Tensor:
        """The rest of the network applied to the first Linear's output: each (BatchNorm,
        ReLU, Linear) step through ``WeightedBatchNorm1d.relu_linear``, then the last BatchNorm."""
        layers = list(self.network)[1:]
        for step in range(0, len(layers) - 1, 3):
            norm, _, linear = layers[step:step + 3]
            x = norm.relu_linear(x, row_weight, linear)
        return layers[-1](x, row_weight)


def renormed_table(embedding: nn.Embedding) -> torch.Tensor:
    """The whole table of a ``max_norm`` embedding after its renormalisation.

    Looking up every row of ``nn.Embedding(max_norm=...)`` rescales, in place and without
    gradient, each row whose norm exceeds ``max_norm`` to ``max_norm / (norm + 1e-7)`` times
    itself, one row at a time. This does the same for all rows in one vectorised step.
    """
    weight = embedding.weight
    with torch.no_grad():
        norms = torch.linalg.vector_norm(weight, ord=embedding.norm_type, dim=1, keepdim=True)
        max_norm = float(embedding.max_norm)
        weight.mul_(torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms)))
    return weight


def distinct_perturbation_sets(pert_idx: torch.Tensor):
    """Distinct perturbation sets of a batch.

    ``pert_idx`` (B x 2, -1 padded) -> ``sets`` (S x 2, each row sorted), ``cell_set`` (B,
    the set of each cell) and ``counts`` (S, cells per set). ``[A, B]`` and ``[B, A]`` are
    the same set, as the model sums the genes' embeddings.
    """
    canonical, _ = torch.sort(pert_idx, dim=1)
    sets, cell_set, counts = torch.unique(canonical, dim=0, return_inverse=True, return_counts=True)
    return sets, cell_set, counts


class GEARSModel(nn.Module):
    """GEARS: predicts a cell's expression after perturbing a set of genes.

    ``forward(x, pert_idx)``: ``x`` (B x G) control expression, ``pert_idx`` (B x 2) indices
    in the perturbation vocabulary, -1 padded. Returns the prediction (B x G), and with
    ``uncertainty`` also the log-variance (B x G).
    """

    def __init__(self, num_genes: int, num_perts: int, coexpress_edge_index: torch.Tensor,
                 coexpress_edge_weight: torch.Tensor, go_edge_index: torch.Tensor, go_edge_weight: torch.Tensor,
                 hidden_size: int = 64, num_go_gnn_layers: int = 1, num_gene_gnn_layers: int = 1,
                 decoder_hidden_size: int = 16, uncertainty: bool = False, no_perturb: bool = False):
        super().__init__()
        self.num_genes, self.num_perts = num_genes, num_perts
        self.uncertainty, self.no_perturb = uncertainty, no_perturb
        self.decoder_hidden_size = decoder_hidden_size  # kept in the config; unused, as in the reference
        h = hidden_size
        # Modules are created in the published order with the published initialisation,
        # so the same torch seed gives the same initial weights.
        self.pert_w = nn.Linear(1, h)  # unused in forward; part of the checkpoint format
        self.gene_emb = nn.Embedding(num_genes, h, max_norm=True)
        self.pert_emb = nn.Embedding(num_perts, h, max_norm=True)
        self.emb_trans_v2 = MLP([h, h, h])
        self.pert_fuse = MLP([h, h, h])
        self.emb_pos = nn.Embedding(num_genes, h, max_norm=True)
        self.layers_emb_pos = nn.ModuleList(SimpleGraphConv(h, h) for _ in range(num_gene_gnn_layers))
        self.sim_layers = nn.ModuleList(SimpleGraphConv(h, h) for _ in range(num_go_gnn_layers))
        self.recovery_w = MLP([h, 2 * h, h])
        self.indv_w1 = nn.Parameter(torch.rand(num_genes, h, 1))
        self.indv_b1 = nn.Parameter(torch.rand(num_genes, 1))
        nn.init.xavier_normal_(self.indv_w1)
        nn.init.xavier_normal_(self.indv_b1)
        self.cross_gene_state = MLP([num_genes, h, h])
        self.indv_w2 = nn.Parameter(torch.rand(1, num_genes, h + 1))
        self.indv_b2 = nn.Parameter(torch.rand(1, num_genes))
        nn.init.xavier_normal_(self.indv_w2)
        nn.init.xavier_normal_(self.indv_b2)
        self.bn_emb = WeightedBatchNorm1d(h)
        self.bn_pert_base = WeightedBatchNorm1d(h)
        self.bn_pert_base_trans = WeightedBatchNorm1d(h)  # unused in forward; part of the checkpoint format
        if uncertainty:
            self.uncertainty_w = MLP([h, 2 * h, h, 1])
        # never used in forward: no gradients (DistributedDataParallel would wait for them)
        self.pert_w.requires_grad_(False)
        self.bn_pert_base_trans.requires_grad_(False)
        # graphs and index vectors move with the module but are not checkpoint entries
        self.register_buffer("coexpress_edge_index", coexpress_edge_index.long(), persistent=False)
        self.register_buffer("coexpress_edge_weight", coexpress_edge_weight.float(), persistent=False)
        self.register_buffer("go_edge_index", go_edge_index.long(), persistent=False)
        self.register_buffer("go_edge_weight", go_edge_weight.float(), persistent=False)

    @staticmethod
    def _propagate(h, layers, edge_index, edge_weight):
        """Graph convolutions with ReLU between them (not after the last)."""
        for i, layer in enumerate(layers):
            h = layer(h, edge_index, edge_weight)
            if i < len(layers) - 1:
                h = h.relu()
        return h

    def gene_embeddings(self) -> torch.Tensor:
        """Per-gene base embedding (G x H), the same for every cell."""
        base = F.relu(self.bn_emb(renormed_table(self.gene_emb)))
        positional = self._propagate(renormed_table(self.emb_pos), self.layers_emb_pos,
                                     self.coexpress_edge_index, self.coexpress_edge_weight)
        return self.emb_trans_v2(base + PERT_EMB_LAMBDA * positional)

    def perturbation_embeddings(self) -> torch.Tensor:
        """GO-propagated embedding of every vocabulary gene (P x H)."""
        return self._propagate(renormed_table(self.pert_emb), self.sim_layers, self.go_edge_index,
                               self.go_edge_weight)

    def set_effects(self, sets: torch.Tensor, counts: torch.Tensor):
        """Predicted change from control (S x G) for each perturbation set, and the
        log-variance (S x G) in uncertainty mode (else None). ``counts`` weight BatchNorm.
        With ``no_perturb`` the change is zero."""
        n_sets, n_genes = sets.shape[0], self.num_genes
        if self.no_perturb:
            zeros = self.indv_b2.new_zeros(n_sets, n_genes)
            return zeros, (zeros if self.uncertainty else None)
        present = sets >= 0
        summed = (self.perturbation_embeddings()[sets.clamp(min=0)] * present.unsqueeze(-1)).sum(1)
        perturbed = torch.nonzero(present.any(1)).flatten()
        shift = torch.zeros_like(summed)
        if len(perturbed):
            shift = shift.index_copy(0, perturbed, self.pert_fuse(summed[perturbed], counts[perturbed]))

        row_weight = counts.repeat_interleave(n_genes)
        hidden = self.gene_embeddings().unsqueeze(0) + shift.unsqueeze(1)           # S x G x H
        hidden = hidden.reshape(n_sets * n_genes, -1)
        if self.uncertainty:  # both heads read relu(bn_pert_base(hidden))
            hidden = F.relu(self.bn_pert_base(hidden, row_weight))
            logvar = self.uncertainty_w(hidden, row_weight).reshape(n_sets, n_genes)
            decoded = self.recovery_w(hidden, row_weight)
        else:
            logvar = None
            decoded = self.recovery_w.after_first_linear(
                self.bn_pert_base.relu_linear(hidden, row_weight, self.recovery_w.network[0]), row_weight)
        decoded = decoded.reshape(n_sets, n_genes, -1)
        gene_out = (decoded * self.indv_w1[:, :, 0]).sum(-1) + self.indv_b1[:, 0]
        cross = self.cross_gene_state(gene_out, counts)                              # S x H
        w2 = self.indv_w2[0]
        effect = gene_out * w2[:, 0] + cross @ w2[:, 1:].T + self.indv_b2[0]
        return effect, logvar

    def forward(self, x: torch.Tensor, pert_idx: torch.Tensor):
        if self.no_perturb:
            return x
        sets, cell_set, counts = distinct_perturbation_sets(pert_idx)
        effect, logvar = self.set_effects(sets, counts)
        prediction = effect[cell_set] + x
        return (prediction, logvar[cell_set]) if self.uncertainty else prediction
