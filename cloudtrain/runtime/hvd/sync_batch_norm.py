"""Horovod's `SyncBatchNorm` on cloudtrain's world, on the CPU (gloo) as on GPUs: batch
normalisation whose statistics are those of the batch of every rank together.

In training (and on more than one rank) each forward pass reduces, over all ranks, the
per-channel sums of the rank's inputs and the sample counts, then the sums of squared
deviations from that mean; it normalises with that mean and biased variance and updates the
running mean and the running variance (unbiased, over the ranks' samples together) as
`torch.nn.BatchNorm` does with the whole batch. The backward pass reduces the gradients of
those sums over all ranks (`_AllReduce`), so the input
gradients are those of one batch norm over the whole batch. In evaluation, or on one rank, it
is `torch.nn.functional.batch_norm`. Ranks may hold batches of different sizes. Every rank
must run the forward (and backward) passes in the same order: they are collectives.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from cloudtrain.runtime.hvd.basics import size

__all__ = ["SyncBatchNorm"]


class _AllReduce(torch.autograd.Function):
    """The sum over all ranks; its gradient, the sum over all ranks of the gradients (each
    rank's loss depends on every rank's input through the sum)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        out = grad.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    """The sum of `t` over all ranks, differentiable."""
    apply: Any = _AllReduce.apply  # untyped in torch
    summed: torch.Tensor = apply(t)
    return summed


class SyncBatchNorm(_BatchNorm):
    """``hvd.SyncBatchNorm(num_features, eps, momentum, affine, track_running_stats)``: see
    the module. Input: (N, C) or (N, C, ...)."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(
                f"SyncBatchNorm: expected at least 2D input (got {input.dim()}D input)"
            )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training or size() == 1:
            return super().forward(input)
        factor = self._momentum_factor()
        dims = [0, *range(2, input.dim())]
        shape = [1, -1] + [1] * (input.dim() - 2)
        count = input.numel() // input.size(1)
        local = torch.cat([input.sum(dims), input.new_tensor([float(count)])])
        total = _all_reduce(local)
        n = total[-1]
        mean = total[:-1] / n
        centred = input - mean.reshape(shape)
        var = _all_reduce((centred * centred).sum(dims)) / n
        if self.track_running_stats and self.running_mean is not None:
            assert self.running_var is not None  # tracked together with the mean
            samples = int(n.item())
            unbiased = var.detach() * samples / max(samples - 1, 1)
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        out = centred * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out

    def _momentum_factor(self) -> float:
        """The weight of this batch in the running statistics (``momentum``, or with
        ``momentum=None`` the cumulative average), counting the batch as `_BatchNorm` does."""
        if not self.track_running_stats or self.num_batches_tracked is None:
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked.item())
        return float(self.momentum)
