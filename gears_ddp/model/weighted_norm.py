"""Training-mode BatchNorm over count-weighted rows, and its fusion with ReLU and Linear.

GEARS computes its per-cell layers once per distinct perturbation set (``gears_ddp.model.network``).
A BatchNorm over those rows must weight each one by how many cells share its set, so that
batch statistics, running statistics, outputs and gradients equal those of the per-cell
rows. The rows come in ``len(set_counts)`` consecutive blocks of equal size (one row per
set, or one row per (set, gene)); every row of block ``i`` stands for ``set_counts[i]``
identical rows. Sums over rows are taken per block first: a weighted sum over the blocks
of a (blocks, rows, features) view reads the rows once.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def blocks_of(x: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """``x`` (rows x features) as a (blocks, rows per block, features) view."""
    return x.view(n_blocks, -1, x.shape[-1])


ROWS_PER_PASS = 4096  # on a CPU: a piece's temporaries stay about 2 MiB at width 128 (in cache)
ROWS_PER_PASS_ACCELERATOR = 2**20  # elsewhere: each operation is a kernel launch, so few, large pieces


def rows_per_pass(device: torch.device) -> int:
    """Rows per piece of a row-wise pass on ``device``: small on a CPU, where a piece should
    stay in cache and memory is the target's; large on a GPU, where the cost of a pass is
    its number of kernel launches (a piece of 2**20 rows of width 128 is 512 MiB)."""
    return ROWS_PER_PASS if device.type == "cpu" else ROWS_PER_PASS_ACCELERATOR


def block_slices(n_blocks: int, rows_per_block: int, device: torch.device) -> list[slice]:
    """Consecutive slices of blocks of about ``rows_per_pass(device)`` rows (at least one block)."""
    step = max(1, rows_per_pass(device) // max(1, rows_per_block))
    return [slice(start, min(start + step, n_blocks)) for start in range(0, n_blocks, step)]


def block_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per block and feature, the sum over the block's rows of ``a * b`` ((blocks, rows,
    features) -> (blocks, features)), a few blocks at a time: the product's temporary is
    one piece, not a copy of the rows."""
    return torch.cat([torch.linalg.vecdot(a[part], b[part], dim=1)
                      for part in block_slices(*a.shape[:2], a.device)])


def row_dot(a: torch.Tensor, b: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """``(a * b).sum(0)`` for two (rows x features) tensors (see ``block_dots``)."""
    return block_dots(blocks_of(a, n_blocks), blocks_of(b, n_blocks)).sum(0)


def all_reduce_if(tensor: torch.Tensor, synchronize: bool) -> torch.Tensor:
    """``tensor`` summed over all ranks, in place, when ``synchronize``; returns it."""
    if synchronize:
        dist.all_reduce(tensor)
    return tensor


def full_precision(x: torch.Tensor) -> torch.Tensor:
    """Half-precision ``x`` in float32 (as autocast runs BatchNorm: half-precision sums over
    many rows overflow); other dtypes unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def weighted_statistics(x, set_counts, eps: float, synchronize: bool, in_place: bool = False):
    """Count-weighted batch statistics of the rows of ``x`` (in float32 for half inputs).

    Returns ``centred = x - mean``, each block's ``share = count / total`` (blocks x 1 x 1),
    ``invstd``, and ``mean``, the biased ``var`` and ``total`` (the number of rows stood
    for). With ``synchronize`` the sums run over the rows of all ranks. With ``in_place``
    the mean is subtracted from ``x`` itself (for a caller that needs ``x`` no more).
    """
    x = full_precision(x)
    n_blocks = len(set_counts)
    weight = set_counts.to(x.dtype)
    rows_per_block = x.shape[0] // n_blocks
    sums = all_reduce_if(torch.cat([(weight.sum() * rows_per_block).unsqueeze(0),
                                    weight @ blocks_of(x, n_blocks).sum(1)]), synchronize)
    total, mean = sums[0], sums[1:] / sums[0]
    centred = x.sub_(mean) if in_place else x - mean
    squares = blocks_of(centred, n_blocks)
    var = all_reduce_if(weight @ block_dots(squares, squares), synchronize) / total
    return centred, (weight / total).view(-1, 1, 1), torch.rsqrt(var + eps), mean, var, total


def normalisation_backward(grad, centred, share, invstd, gamma, synchronize: bool, in_place: bool = False):
    """Gradients of ``gamma * centred * invstd + beta`` through the weighted statistics.

    ``dx = a * g - share * (a * sum(g) + centred * a * invstd * sum(g * xhat))`` with
    ``a = gamma * invstd``; each row's gradient ``g`` is already the sum over the identical
    rows it stands for. Returns ``(dx, dgamma, dbeta)`` (this rank's sums); with
    ``synchronize`` the sums in ``dx`` run over all ranks' rows. With ``in_place`` ``dx``
    is written into ``centred`` (for a caller that needs it no more), else into a new tensor.
    """
    grad = grad.to(centred.dtype)
    n_blocks = share.shape[0]
    local = torch.stack([grad.sum(0), row_dot(grad, centred, n_blocks) * invstd])
    grad_beta, grad_gamma = all_reduce_if(local.clone(), synchronize)
    scale = gamma * invstd
    out = statistics_gradient(centred, share, scale, invstd, grad_gamma, grad_beta, in_place)
    return out.addcmul_(grad, scale), local[1], local[0]


def statistics_gradient(centred, share, scale, invstd, grad_gamma, grad_beta, in_place: bool):
    """The part of a weighted BatchNorm's input gradient that flows through its batch
    statistics, ``-share * scale * (grad_beta + centred * invstd * grad_gamma)``, in one
    pass, written over ``centred`` when ``in_place`` (the caller adds ``scale`` times the
    rows' own gradient)."""
    blocks = blocks_of(centred, share.shape[0])
    terms = (-share * (scale * grad_beta), blocks, -share * (scale * invstd * grad_gamma))
    return (torch.addcmul(*terms, out=blocks) if in_place else torch.addcmul(*terms)).view_as(centred)


def relu_mask_(grad: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
    """``grad`` times ReLU's derivative at the output ``activated``, in place on ``grad``, in
    one pass (ReLU's own backward kernel; a boolean mask with ``masked_fill_`` is over ten
    times slower on CPU)."""
    return torch.ops.aten.threshold_backward.grad_input(grad, activated, 0, grad_input=grad)


class _WeightedBatchNorm(torch.autograd.Function):
    """Training-mode BatchNorm over count-weighted rows, with its analytic backward: a few
    fused passes instead of autograd's chain of elementwise operations."""

    @staticmethod
    def forward(ctx, x, set_counts, gamma, beta, eps: float, synchronize: bool):
        ctx.input_dtype, ctx.synchronize = x.dtype, synchronize
        centred, share, invstd, mean, var, total = weighted_statistics(x, set_counts, eps, synchronize)
        ctx.save_for_backward(centred, share, invstd, gamma)
        ctx.mark_non_differentiable(mean, var, total)
        return torch.addcmul(beta, centred, invstd * gamma), mean, var, total

    @staticmethod
    def backward(ctx, grad, *_):
        centred, share, invstd, gamma = ctx.saved_tensors
        grad_x, grad_gamma, grad_beta = normalisation_backward(grad, centred, share, invstd, gamma, ctx.synchronize)
        return grad_x.to(ctx.input_dtype), None, grad_gamma, grad_beta, None, None


def relu_normalised(centred, invstd, gamma, beta):
    """``relu(gamma * centred * invstd + beta)``, the activation after a BatchNorm."""
    return torch.addcmul(beta, centred, invstd * gamma).relu_()


class _WeightedBatchNormReluLinear(torch.autograd.Function):
    """``linear(relu(weighted BatchNorm(x)))`` that keeps only the centred input for the
    backward pass and recomputes the activation there.

    Unfused, autograd keeps the centred input, the ReLU output and (the same tensor) the
    Linear's input. Under autocast the Linear runs as autocast runs it (its output's dtype
    is recorded and the backward products use it).
    """

    @staticmethod
    def forward(ctx, x, set_counts, gamma, beta, eps: float, synchronize: bool, weight, bias):
        ctx.input_dtype, ctx.synchronize = x.dtype, synchronize
        centred, share, invstd, mean, var, total = weighted_statistics(x, set_counts, eps, synchronize)
        out = F.linear(relu_normalised(centred, invstd, gamma, beta), weight, bias)
        ctx.matmul_dtype = out.dtype
        ctx.save_for_backward(centred, share, invstd, gamma, beta, weight, bias)
        ctx.mark_non_differentiable(mean, var, total)
        return out, mean, var, total

    @staticmethod
    def backward(ctx, grad, *_):
        centred, share, invstd, gamma, beta, weight, bias = ctx.saved_tensors
        activated = relu_normalised(centred, invstd, gamma, beta)
        grad = grad.to(ctx.matmul_dtype)
        grad_weight = grad.T.mm(activated.to(ctx.matmul_dtype)).to(weight.dtype)
        grad_bias = grad.sum(0).to(bias.dtype)
        grad_activated = relu_mask_(grad.mm(weight.to(ctx.matmul_dtype)).to(centred.dtype), activated)
        del activated
        grad_x, grad_gamma, grad_beta = normalisation_backward(grad_activated, centred, share, invstd, gamma,
                                                               ctx.synchronize)
        return grad_x.to(ctx.input_dtype), None, grad_gamma, grad_beta, None, None, grad_weight, grad_bias


class WeightedBatchNorm1d(nn.BatchNorm1d):
    """``BatchNorm1d`` whose training-mode statistics can weight rows by a count.

    ``set_counts`` splits the rows into that many equal consecutive blocks; a row of block
    ``i`` counts as ``set_counts[i]`` identical rows. Mean, biased variance (used to
    normalise) and the unbiased variance fed to the running estimate are those of the
    expanded batch. Without counts, or in evaluation mode, it is ``BatchNorm1d``.

    With ``synchronize`` set (distributed ``sync_batchnorm``), weighted statistics are those
    of the batches of all ranks together. (The per-gene part's rows are the same on every
    rank, so for them this changes only the count behind the running variance, which then
    is that of all ranks' cells, as a synchronised BatchNorm over the published per-cell
    rows has it.)
    """

    synchronize = False

    def forward(self, x: torch.Tensor, set_counts: torch.Tensor | None = None) -> torch.Tensor:
        if set_counts is None or not self.training:
            return super().forward(x)
        out, mean, var, total = _WeightedBatchNorm.apply(x, set_counts, self.weight, self.bias, self.eps,
                                                         self.synchronizing())
        self.update_running_stats(mean, var, total)
        return out

    def relu_linear(self, x: torch.Tensor, set_counts: torch.Tensor | None, linear: nn.Linear) -> torch.Tensor:
        """``linear(relu(self(x, set_counts)))``; with counts in training mode, fused so that
        the backward pass keeps one tensor of ``x``'s size instead of three."""
        if set_counts is None or not self.training:
            return linear(F.relu(self(x, set_counts)))
        out, mean, var, total = _WeightedBatchNormReluLinear.apply(
            x, set_counts, self.weight, self.bias, self.eps, self.synchronizing(), linear.weight, linear.bias)
        self.update_running_stats(mean, var, total)
        return out

    def synchronizing(self) -> bool:
        return self.synchronize and dist.is_initialized()

    @torch.no_grad()
    def update_running_stats(self, mean, var, n_rows) -> None:
        """Fold a batch's weighted mean and biased variance over ``n_rows`` rows (a tensor)
        into the running estimates, as ``BatchNorm1d`` does; with a momentum (the default),
        in tensor operations only, so without a host synchronisation on a GPU."""
        if not self.track_running_stats:
            return
        self.num_batches_tracked.add_(1)
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        correction = n_rows / (n_rows - 1).clamp(min=1)  # the unbiased variance (of one row: as it is)
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_((var * correction).to(self.running_var.dtype), factor)
