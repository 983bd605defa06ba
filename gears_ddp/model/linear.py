"""``linear(x, weight, bias)``, the function of ``nn.Linear``, with its backward pass written
out: three matrix products and a sum (autograd's own takes eight operators, five of them
transposes and views), for the Linears of every training step.

Under autocast the forward product runs as autocast runs it, and the backward products in
the same precision; the gradients come back in the parameters' and the input's dtypes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        out = F.linear(x, weight, bias)
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dtype = grad.dtype
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.mm(weight.to(dtype)).to(x.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = grad.T.mm(x.to(dtype)).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0).to(weight.dtype)
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, module: nn.Linear) -> torch.Tensor:
    """``module(x)`` for a 2-D ``x``, with the written-out backward pass when a gradient is
    needed."""
    if x.dim() != 2 or not torch.is_grad_enabled():
        return module(x)
    return _Linear.apply(x, module.weight, module.bias)
