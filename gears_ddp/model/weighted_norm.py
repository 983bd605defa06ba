"""Training-mode BatchNorm over rows that stand for several cells each, and its fusion with
ReLU and Linear.

GEARS computes its per-cell layers once per distinct perturbation set (``model.network``).
A BatchNorm over those rows must weight each one by how many cells share its set, so that
batch statistics, running statistics, outputs and gradients equal those of the per-cell
rows. The rows come in ``len(set_counts)`` consecutive blocks of equal size (one row per
set, or one row per (set, gene)); every row of block ``i`` stands for ``set_counts[i]``
identical rows, that is for a share ``set_counts[i] / rows stood for`` of the batch
(``block_shares``). The statistics are sums weighted by those shares (``RowShares``, in
full precision even under autocast), and the backward passes are written out
(a few fused operations instead of autograd's chain). Rows that all stand for the same
number of cells (the per-gene rows) need no weights: BatchNorm's own kernels normalise them.
"""

from __future__ import annotations

import contextlib
from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gears_ddp.model.linear import linear as linear_function


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
    """Consecutive slices of blocks of about ``rows_per_pass(device)`` rows (at least one block).
    In a ``torch.compile``d graph, one slice of all: its kernels fuse the pieces' temporaries
    away, and a loop over a number of pieces that changes with the batch would recompile it
    for every number of perturbation sets."""
    if torch.compiler.is_compiling():
        return [slice(0, n_blocks)]
    step = max(1, rows_per_pass(device) // max(1, rows_per_block))
    return [slice(start, min(start + step, n_blocks)) for start in range(0, n_blocks, step)]


def all_reduce_if(tensor: torch.Tensor, synchronize: bool) -> torch.Tensor:
    """``tensor`` summed over all ranks, in place, when ``synchronize``; returns it."""
    if synchronize:
        dist.all_reduce(tensor)
    return tensor


def summed_over_ranks(tensors: list[torch.Tensor], synchronize: bool) -> list[torch.Tensor]:
    """Equally shaped ``tensors``, each summed over all ranks (one all-reduce) when
    ``synchronize``; as they are otherwise."""
    if not synchronize:
        return tensors
    return list(all_reduce_if(torch.stack(tensors), True).unbind(0))


def full_precision(x: torch.Tensor) -> torch.Tensor:
    """Half-precision ``x`` in float32 (as autocast runs BatchNorm: half-precision sums over
    many rows overflow); other dtypes unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def block_shares(set_counts: torch.Tensor, rows_per_block: int, dtype: torch.dtype, synchronize: bool):
    """Each block's rows' share of all the rows they stand for, ``set_counts[i] / total``
    (blocks,), and ``total``, the number of rows stood for (a 0-dim tensor): over all ranks'
    blocks when ``synchronize``. Rows that stand for no row at all (a padded batch with no
    perturbed cell) get shares of 0, and ``total`` 0 tells their running statistics so."""
    weight = set_counts.to(dtype)
    total = weight.sum() if rows_per_block == 1 else weight.sum() * rows_per_block
    all_reduce_if(total, synchronize)
    return weight / total.clamp(min=1), total


class RowShares:
    """Each row's share of the rows stood for, as ``block_shares`` gives them: the rows come in
    ``len(shares)`` equal consecutive blocks of ``rows_per_block`` rows, every row of block
    ``i`` with the share ``shares[i]``. ``sum`` and ``sum_of_squares`` weight rows by them."""

    def __init__(self, shares: torch.Tensor, rows_per_block: int):
        self.shares, self.rows_per_block = shares, rows_per_block
        self._per_row: torch.Tensor | None = None

    def sum(self, x: torch.Tensor, blocks: slice | None = None) -> torch.Tensor:
        """The weighted sum (1 x features) of the rows ``x`` of the blocks ``blocks`` (all when
        None): the sum of each block's rows weighted by its share on a CPU with several
        threads (not ``sums_as_products``), else one matrix-vector product with every row's share."""
        if self.rows_per_block == 1 or not sums_as_products(x.device):
            shares = (self.shares if blocks is None else self.shares[blocks]).view(1, -1)
            if self.rows_per_block > 1:
                x = x.view(shares.shape[1], self.rows_per_block, -1).sum(1)  # each block's rows summed
            return shares.mm(x)
        if self._per_row is None:
            self._per_row = self.shares.repeat_interleave(
                self.rows_per_block, output_size=len(self.shares) * self.rows_per_block
            ).view(1, -1)
        return (self._per_row if blocks is None else self._per_row[:, self._rows(blocks)]).mm(x)

    def sum_of_squares(self, x: torch.Tensor) -> torch.Tensor:
        """``sum(x * x)``, a piece of blocks at a time (``block_slices``): the square's
        temporary is one piece, not a copy of the rows."""
        pieces = block_slices(len(self.shares), self.rows_per_block, x.device)
        if len(pieces) == 1:
            return self.sum(x * x)
        rows = [x[self._rows(part)] for part in pieces]  # views
        # several pieces (one returned above), so the sum is a tensor, not sum's start 0
        return cast(torch.Tensor, sum(self.sum(piece * piece, part) for piece, part in zip(rows, pieces)))

    def _rows(self, blocks: slice) -> slice:
        return slice(blocks.start * self.rows_per_block, blocks.stop * self.rows_per_block)


def minus_block_shares(shares: torch.Tensor) -> torch.Tensor:
    """``-shares`` as (blocks, 1, 1), to broadcast over a (blocks, rows, features) view."""
    return -shares.view(-1, 1, 1)


def weighted_moments(x, weights: RowShares, synchronize: bool, in_place: bool = False):
    """``centred = x - mean``, ``mean`` and biased ``var`` (vectors of features) of the rows
    of ``x`` (in float32 for half inputs), weighted by ``weights``. With ``synchronize`` the
    sums run over the rows of all ranks. With ``in_place`` the mean is subtracted from ``x``
    itself (for a caller that needs ``x`` no more)."""
    x = full_precision(x)
    with torch.autocast(x.device.type, enabled=False):  # sums of many rows: in full precision
        mean = all_reduce_if(weights.sum(x).view(-1), synchronize)
        centred = x.sub_(mean) if in_place else x - mean
        var = all_reduce_if(weights.sum_of_squares(centred).view(-1), synchronize)
    return centred, mean, var


def weighted_statistics(x, weights, eps: float, synchronize: bool, in_place: bool = False):
    """``weighted_moments`` and ``invstd``."""
    centred, mean, var = weighted_moments(x, weights, synchronize, in_place)
    return centred, mean, var, torch.rsqrt(var + eps)


def in_cache_pieces(device: torch.device) -> bool:
    """Whether row-wise passes on ``device`` run in cache-sized pieces (``rows_per_pass``: a
    CPU). There column variances have a faster equivalent (``mean_and_variance``); elsewhere
    each operator is a kernel launch, and the one operator is kept."""
    return rows_per_pass(device) < ROWS_PER_PASS_ACCELERATOR


def sums_as_products(device: torch.device) -> bool:
    """Whether sums over rows run as matrix-vector products (with ones, or with the rows'
    shares) rather than as torch's reductions: on a GPU, and on a CPU (``in_cache_pieces``)
    with one torch thread. On an H200 torch's reduction over the 160,000 rows of a
    Norman-size step's (160,000 x 128) tensors took 157 us, the matrix-vector product over
    the same rows 25 us (benchmarks/RESULTS.md, 2026-12-04). On a CPU the BLAS's
    matrix-vector kernel runs on one thread whatever torch's thread count, where torch's
    reductions split the rows between the threads; at one thread the product is as fast or
    faster, depending on the CPU. In a ``torch.compile``d graph, which cannot read the
    thread count, products."""
    if not in_cache_pieces(device):
        return True
    return torch.compiler.is_compiling() or torch.get_num_threads() == 1


def first_dim_sum(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(0)``; as a matrix-vector product with ones where that is the faster
    (``sums_as_products``)."""
    if not sums_as_products(x.device):
        return x.sum(0)
    return torch.mv(x.reshape(x.shape[0], -1).T, x.new_ones(x.shape[0])).view(x.shape[1:])


def mean_and_variance(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Column means and biased variances of ``x`` (rows x features); in cache-sized pieces in
    two passes (the mean, then the centred squares' mean), as a CPU's ``var_mean`` over rows
    updates its running moments one value at a time, several times slower."""
    if not in_cache_pieces(x.device):
        var, mean = torch.var_mean(x, 0, correction=0)
        return mean, var
    mean = x.mean(0)
    return mean, (x - mean).square_().mean(0)


def column_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(0)`` for two (rows x features) tensors, a piece of rows at a time."""
    pieces = block_slices(a.shape[0], 1, a.device)
    if len(pieces) == 1:
        return first_dim_sum(a * b)
    # several pieces (one returned above), so the sum is a tensor, not sum's start 0
    return cast(torch.Tensor, sum(first_dim_sum(a[part] * b[part]) for part in pieces))


def normalisation_backward(grad, centred, minus_shares, invstd, gamma, synchronize: bool, in_place: bool = False):
    """Gradients of ``gamma * centred * invstd + beta`` through the weighted statistics.

    ``dx = a * g - share * (a * sum(g) + centred * a * invstd * sum(g * xhat))`` with
    ``a = gamma * invstd``; each row's gradient ``g`` is already the sum over the identical
    rows it stands for (``minus_shares``: ``minus_block_shares``). Returns ``(dx, dgamma,
    dbeta)`` (this rank's sums); with ``synchronize`` the sums in ``dx`` run over all ranks'
    rows. With ``in_place`` ``dx`` is written into ``centred`` (for a caller that needs it no
    more), else into a new tensor.
    """
    grad = grad.to(centred.dtype)
    local_beta, local_gamma = first_dim_sum(grad), column_dot(grad, centred) * invstd
    grad_beta, grad_gamma = summed_over_ranks([local_beta, local_gamma], synchronize)
    scale = gamma * invstd
    out = statistics_gradient(centred, minus_shares, scale, invstd, grad_gamma, grad_beta, in_place)
    return out.addcmul_(grad, scale), local_gamma, local_beta


def statistics_gradient(centred, minus_shares, scale, invstd, grad_gamma, grad_beta, in_place: bool):
    """The part of a weighted BatchNorm's input gradient that flows through its batch
    statistics, ``-share * scale * (grad_beta + centred * invstd * grad_gamma)``, in one
    pass, written over ``centred`` when ``in_place`` (the caller adds ``scale`` times the
    rows' own gradient)."""
    blocks = blocks_of(centred, minus_shares.shape[0])
    terms = (minus_shares * (scale * grad_beta), blocks, minus_shares * (scale * invstd * grad_gamma))
    return (torch.addcmul(*terms, out=blocks) if in_place else torch.addcmul(*terms)).view_as(centred)


def relu_mask_(grad: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
    """``grad`` times ReLU's derivative at the output ``activated``, in place on ``grad``, in
    one pass (ReLU's own backward kernel; a boolean mask with ``masked_fill_`` is over ten
    times slower on CPU)."""
    return torch.ops.aten.threshold_backward.grad_input(grad, activated, 0, grad_input=grad)


def relu_normalised(centred, invstd, gamma, beta):
    """``relu(gamma * centred * invstd + beta)``, the activation after a BatchNorm."""
    return torch.addcmul(beta, centred, invstd * gamma).relu_()


class _WeightedBatchNorm(torch.autograd.Function):
    """Training-mode BatchNorm over weighted rows, with its analytic backward."""

    @staticmethod
    def forward(ctx, x, shares, rows_per_block: int, gamma, beta, eps: float, synchronize: bool):
        ctx.input_dtype, ctx.synchronize = x.dtype, synchronize
        ctx.set_materialize_grads(False)  # the statistics' (absent) gradients need no zeros
        centred, mean, var, invstd = weighted_statistics(x, RowShares(shares, rows_per_block), eps, synchronize)
        ctx.save_for_backward(centred, shares, invstd, gamma)
        ctx.mark_non_differentiable(mean, var)
        return torch.addcmul(beta, centred, invstd * gamma), mean, var

    @staticmethod
    def backward(ctx, grad, *_):
        centred, shares, invstd, gamma = ctx.saved_tensors
        grad_x, grad_gamma, grad_beta = normalisation_backward(
            grad, centred, minus_block_shares(shares), invstd, gamma, ctx.synchronize
        )
        return grad_x.to(ctx.input_dtype), None, None, grad_gamma, grad_beta, None, None


class _WeightedBatchNormReluLinear(torch.autograd.Function):
    """``linear(relu(weighted BatchNorm(x)))`` that keeps only the centred input for the
    backward pass and recomputes the activation there.

    Unfused, autograd keeps the centred input, the ReLU output and (the same tensor) the
    Linear's input. Under autocast the Linear runs as autocast runs it (its output's dtype
    is recorded and the backward products use it).
    """

    @staticmethod
    def forward(ctx, x, shares, rows_per_block: int, gamma, beta, eps: float, synchronize: bool, weight, bias):
        ctx.input_dtype, ctx.synchronize = x.dtype, synchronize
        ctx.set_materialize_grads(False)  # the statistics' (absent) gradients need no zeros
        centred, mean, var, invstd = weighted_statistics(x, RowShares(shares, rows_per_block), eps, synchronize)
        out = F.linear(relu_normalised(centred, invstd, gamma, beta), weight, bias)
        ctx.matmul_dtype = out.dtype
        ctx.save_for_backward(centred, shares, invstd, gamma, beta, weight)
        ctx.mark_non_differentiable(mean, var)
        return out, mean, var

    @staticmethod
    def backward(ctx, grad, *_):
        centred, shares, invstd, gamma, beta, weight = ctx.saved_tensors
        activated = relu_normalised(centred, invstd, gamma, beta)
        grad = grad.to(ctx.matmul_dtype)
        grad_weight = grad.T.mm(activated.to(ctx.matmul_dtype)).to(weight.dtype)
        grad_bias = grad.sum(0).to(weight.dtype)
        grad_activated = relu_mask_(grad.mm(weight.to(ctx.matmul_dtype)).to(centred.dtype), activated)
        del activated
        grad_x, grad_gamma, grad_beta = normalisation_backward(
            grad_activated, centred, minus_block_shares(shares), invstd, gamma, ctx.synchronize
        )
        return grad_x.to(ctx.input_dtype), None, None, grad_gamma, grad_beta, None, None, grad_weight, grad_bias


class WeightedBatchNorm1d(nn.BatchNorm1d):
    """``BatchNorm1d`` whose training-mode statistics can weight rows by a count.

    ``set_counts`` splits the rows into that many equal consecutive blocks; a row of block
    ``i`` counts as ``set_counts[i]`` identical rows. Mean, biased variance (used to
    normalise) and the unbiased variance fed to the running estimate are those of the
    expanded batch. A number instead of a tensor counts every row that many times: the
    normalisation is BatchNorm's own, only the running variance's unbiased correction
    changes. Without counts, or in evaluation mode, it is ``BatchNorm1d``.

    With ``synchronize`` set (distributed ``sync_batchnorm``), weighted statistics are those
    of the batches of all ranks together. (The per-gene part's rows are the same on every
    rank, so for them this changes only the count behind the running variance, which then
    is that of all ranks' cells, as a synchronised BatchNorm over the published per-cell
    rows has it.)
    """

    synchronize = False

    def forward(self, x: torch.Tensor, set_counts: torch.Tensor | int | None = None) -> torch.Tensor:
        if set_counts is None or not self.training:
            return super().forward(x)
        if isinstance(set_counts, int) and not self.synchronizing():
            return self._repeated_rows(x, set_counts)
        shares, rows_per_block, total = self._shares(x, set_counts)
        out, mean, var = _WeightedBatchNorm.apply(
            x, shares, rows_per_block, self.weight, self.bias, self.eps, self.synchronizing()
        )
        update_running_statistics([self], [mean], [var], total)
        return out

    def relu_linear(self, x: torch.Tensor, set_counts: torch.Tensor | int | None, linear: nn.Linear) -> torch.Tensor:
        """``linear(relu(self(x, set_counts)))``; with weighted rows in training mode, fused so
        that the backward pass keeps one tensor of ``x``'s size instead of three."""
        if set_counts is None or not self.training or (isinstance(set_counts, int) and not self.synchronizing()):
            return linear_function(F.relu(self(x, set_counts)), linear)
        shares, rows_per_block, total = self._shares(x, set_counts)
        out, mean, var = _WeightedBatchNormReluLinear.apply(
            x,
            shares,
            rows_per_block,
            self.weight,
            self.bias,
            self.eps,
            self.synchronizing(),
            linear.weight,
            linear.bias,
        )
        update_running_statistics([self], [mean], [var], total)
        return out

    def synchronizing(self) -> bool:
        return self.synchronize and dist.is_initialized()

    def _shares(self, x: torch.Tensor, set_counts: torch.Tensor | int):
        """The blocks' shares, the rows in a block and the rows stood for (``block_shares``)."""
        if isinstance(set_counts, int):
            set_counts = torch.tensor([set_counts], device=x.device)
        rows_per_block = x.shape[0] // len(set_counts)
        shares, total = block_shares(set_counts, rows_per_block, full_precision(x).dtype, self.synchronizing())
        return shares, rows_per_block, total

    def _repeated_rows(self, x: torch.Tensor, copies: int) -> torch.Tensor:
        """Training mode on rows that each stand for ``copies`` identical rows: BatchNorm's
        kernel normalises them (the copies change no statistic), and the running estimates
        take the variance's unbiased correction of ``copies`` times as many rows."""
        x = full_precision(x)
        out = torch.batch_norm(x, self.weight, self.bias, None, None, True, 0.0, self.eps, torch.backends.cudnn.enabled)
        with torch.no_grad():
            mean, var = mean_and_variance(x)
        update_running_statistics([self], [mean], [var], copies * x.shape[0])
        return out


def update_running_statistics(norms: list[nn.BatchNorm1d], means, variances, n_rows) -> None:
    """Fold each BatchNorm's batch mean and biased variance over ``n_rows`` rows (a number, or
    a 0-dim tensor) into its running estimates, as ``BatchNorm1d`` does; inside
    ``running_statistics_together`` at its end, with the other updates of the same number of
    rows."""
    if _together:
        _together[-1].append((norms, means, variances, n_rows))
    else:
        _apply_running_statistics(norms, means, variances, n_rows)


_together: list[list] = []  # the updates each open running_statistics_together holds back


@contextlib.contextmanager
def running_statistics_together():
    """Holds back ``update_running_statistics`` until the block ends, then applies the updates
    of the same number of rows together: a few operations on lists for all the BatchNorms of
    a forward pass instead of a few for each."""
    held: list = []
    _together.append(held)
    try:
        yield
    finally:
        _together.pop()
    groups: list[tuple] = []  # (norms, means, variances, n_rows), one per number of rows
    for norms, means, variances, n_rows in held:
        # a count tensor is the same count only as the same object (no id(): torch.compile traces this)
        group = next((group for group in groups if _same_count(group[3], n_rows)), None)
        if group is None:
            group = ([], [], [], n_rows)
            groups.append(group)
        for collected, values in zip(group, (norms, means, variances)):
            collected.extend(values)
    for norms, means, variances, n_rows in groups:
        _apply_running_statistics(norms, means, variances, n_rows)


def _same_count(a, b) -> bool:
    """Whether two row counts (numbers, or 0-dim tensors) are the same count without reading a
    tensor: numbers by value, tensors by identity."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    return a == b


@torch.no_grad()
def _apply_running_statistics(norms, means, variances, n_rows) -> None:
    """The updates of ``update_running_statistics``, in a few operations on lists and without
    a host synchronisation (with ``momentum=None``, the cumulative average, as a tensor
    weight). ``n_rows`` as a tensor may be 0 (a padded batch's BatchNorm that no cell
    reached): then nothing changes, as the published model runs no such BatchNorm."""
    norms_means_vars = [(n, m, v) for n, m, v in zip(norms, means, variances) if n.track_running_stats]
    if not norms_means_vars:
        return
    norms, means, variances = map(list, zip(*norms_means_vars))
    if isinstance(n_rows, torch.Tensor):
        stood = n_rows > 0
        torch._foreach_add_([norm.num_batches_tracked for norm in norms], [stood.long()] * len(norms))
        stood = stood.to(norms[0].running_mean.dtype)  # a momentum times it keeps the statistics' precision
        correction = n_rows / (n_rows - 1).clamp(min=1)
    else:
        stood = None
        torch._foreach_add_([norm.num_batches_tracked for norm in norms], 1)
        correction = n_rows / max(n_rows - 1, 1)  # the unbiased variance (of one row: as it is)
    unbiased = torch._foreach_mul(variances, correction)
    if all(norm.momentum == norms[0].momentum for norm in norms) and norms[0].momentum is not None:
        momentum = norms[0].momentum if stood is None else [stood * norms[0].momentum] * len(norms)
        torch._foreach_lerp_([norm.running_mean for norm in norms], means, momentum)
        torch._foreach_lerp_([norm.running_var for norm in norms], unbiased, momentum)
        return
    for norm, mean, var in zip(norms, means, unbiased):
        if stood is None:
            # the cumulative weight as a tensor of the statistics' dtype (torch < 2.5 lerps by no other)
            factor = (
                norm.num_batches_tracked.to(norm.running_mean.dtype).reciprocal()
                if norm.momentum is None
                else norm.momentum
            )
        else:
            factor = stood / norm.num_batches_tracked.clamp(min=1) if norm.momentum is None else stood * norm.momentum
        norm.running_mean.lerp_(mean, factor)
        norm.running_var.lerp_(var, factor)
