"""Horovod's API on torch.distributed, for scripts written the Horovod way that must run where
Horovod cannot be built (its last release does not build against torch >= 2.1 as published)::

    import cloudtrain.runtime.hvd as hvd

    hvd.init()
    model.to(hvd.local_rank() ...)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    ...
    loss = hvd.allreduce(loss, op=hvd.Average)

The job is what `cloudtrain train` starts (torchrun's workers: ``RANK``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``…); the group is `cloudtrain.runtime.init`'s. The
differences from Horovod, on purpose: gradients are averaged in one flat all-reduce when
``step()`` is called (Horovod overlaps them with the backward pass through hooks), and the
``name``/``compression`` arguments are accepted and ignored. Like Horovod, a
``DistributedOptimizer`` with ``backward_passes_per_step=N`` expects N ``backward()`` calls per
``step()`` (the gradients add up locally, then are averaged across ranks, not divided by N).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from cloudtrain.runtime import dist as group

__all__ = [
    "Average",
    "DistributedOptimizer",
    "Sum",
    "allgather",
    "allreduce",
    "broadcast",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "cross_rank",
    "cross_size",
    "init",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
]

#: The reduce operations, by Horovod's names.
Average, Sum = "average", "sum"


def init() -> None:
    """Join the job's process group (`cloudtrain.runtime.init`). Idempotent."""
    group.init()


def shutdown() -> None:
    group.shutdown()


def rank() -> int:
    return group.rank()


def size() -> int:
    return group.world_size()


def local_rank() -> int:
    return group.local_rank()


def _env(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw.isdigit() else default


def local_size() -> int:
    """How many processes run on this node (torchrun's ``LOCAL_WORLD_SIZE``)."""
    return _env("LOCAL_WORLD_SIZE", 1)


def cross_rank() -> int:
    """This node's rank among the nodes (torchrun's ``GROUP_RANK``)."""
    return _env("GROUP_RANK", 0)


def cross_size() -> int:
    """How many nodes the job has."""
    return max(1, size() // max(1, local_size()))


def _comm(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` where the backend can reduce it (the GPU for nccl, else the CPU)."""
    where = group.device() if dist.get_backend() == "nccl" else torch.device("cpu")
    return t.detach().to(where, copy=True)


def allreduce(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str = Average
) -> torch.Tensor:
    """The sum or the mean of `tensor` over every rank, as a new tensor on its device.
    Collective. (`average` is Horovod's older spelling of ``op``.)"""
    if average is not None:
        op = Average if average else Sum
    if op not in (Average, Sum):
        raise ValueError(f"op {op!r}: use hvd.Average or hvd.Sum")
    if size() == 1:
        return tensor.detach().clone()
    if not (tensor.is_floating_point() or tensor.is_complex()) and op == Average:
        tensor = tensor.to(torch.get_default_dtype())
    buf = _comm(tensor)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    if op == Average:
        buf /= size()
    return buf.to(tensor.device)


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the first dimension, in rank order; the first
    dimension may differ between ranks (the others may not). Collective."""
    if size() == 1:
        return tensor.detach().clone()
    t = tensor.detach().reshape(tensor.shape or (1,))
    counts = [torch.zeros(1, dtype=torch.long) for _ in range(size())]
    dist.all_gather(counts, _comm(torch.tensor([t.shape[0]])).cpu())
    longest = int(max(c.item() for c in counts))
    padded = torch.zeros((longest, *t.shape[1:]), dtype=t.dtype, device=t.device)
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(_comm(padded)) for _ in range(size())]
    dist.all_gather(parts, _comm(padded))
    joined = torch.cat([p[: int(c.item())] for p, c in zip(parts, counts, strict=True)])
    return joined.to(tensor.device)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """`root_rank`'s `tensor`, on every rank, as a new tensor. Collective."""
    if size() == 1:
        return tensor.detach().clone()
    buf = _comm(tensor)
    dist.broadcast(buf, src=root_rank)
    return buf.to(tensor.device)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """`root_rank`'s picklable `obj`, on every rank. Collective."""
    if size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], root_rank: int
) -> None:
    """Overwrite, in place, each of `params` (a ``state_dict()`` or ``named_parameters()``)
    with `root_rank`'s. Collective."""
    items = list(params.items() if isinstance(params, Mapping) else params)
    with torch.no_grad():
        for _, value in items:
            if isinstance(value, torch.Tensor):
                value.copy_(broadcast(value, root_rank))


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Give every rank `root_rank`'s optimizer state (its moments, step counts and
    hyperparameters). Collective."""
    optimizer.load_state_dict(broadcast_object(optimizer.state_dict(), root_rank))


class DistributedOptimizer:
    """`optimizer` whose ``step()`` first averages (or sums, ``op=Sum``) every parameter's
    gradient over all ranks — one flat all-reduce per dtype and device — then steps. Every
    other attribute is the wrapped optimizer's."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        compression: object = None,
        backward_passes_per_step: int = 1,
        op: str = Average,
    ) -> None:
        if isinstance(backward_passes_per_step, bool) or backward_passes_per_step < 1:
            raise ValueError(
                f"backward_passes_per_step {backward_passes_per_step!r}: use 1 or more"
            )
        if op not in (Average, Sum):
            raise ValueError(f"op {op!r}: use hvd.Average or hvd.Sum")
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if named_parameters is not None:
            foreign = [n for n, p in named_parameters if id(p) not in owned]
            if foreign:
                raise ValueError(f"named_parameters not in the optimizer: {foreign[:5]}")
        self.optimizer = optimizer
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def synchronize(self) -> None:
        """Reduce the gradients now (``step`` does it itself)."""
        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"]
                 if p.grad is not None]  # fmt: skip
        if size() == 1 or not grads:
            return
        buckets: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for grad in grads:
            buckets.setdefault((grad.dtype, grad.device), []).append(grad)
        for bucket in buckets.values():
            flat = _comm(torch.cat([g.reshape(-1) for g in bucket]))
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            if self.op == Average:
                flat /= size()
            flat, at = flat.to(bucket[0].device), 0
            for grad in bucket:
                grad.copy_(flat[at : at + grad.numel()].view_as(grad))
                at += grad.numel()

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        self.synchronize()
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
