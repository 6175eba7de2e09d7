"""Horovod's collectives on torch.distributed. Each is collective (every rank calls it, in the
same order) and starts with the negotiation of `basics`. The ``name`` arguments are accepted
and ignored (torch.distributed matches collectives by order, not by name). The ``*_async``
forms run at once and return a handle: `poll` is then always True, `synchronize` gives the
result."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from cloudtrain.runtime.hvd.basics import (
    Average,
    Sum,
    check_op,
    comm_device,
    negotiate,
    reduce_op,
    size,
)
from cloudtrain.runtime.hvd.compression import Compression, Compressor
from cloudtrain.runtime.hvd.sets import ProcessSet, global_process_set, only_global

__all__ = [
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "poll",
    "reducescatter",
    "reducescatter_async",
    "synchronize",
]

_results: dict[int, Any] = {}
_handles = itertools.count(1)


def _handle(result: Any) -> int:
    handle = next(_handles)
    _results[handle] = result
    return handle


def poll(handle: int) -> bool:
    """True: the operation behind `handle` ran when it was asked for."""
    return True


def synchronize(handle: int) -> Any:
    """The result of the operation behind `handle` (None for one already collected)."""
    return _results.pop(handle, None)


def _op(op: str | None, average: bool | None) -> str:
    if average is not None:
        return Average if average else Sum
    return check_op(Average if op is None else op)


def reduce_flat(
    flat: torch.Tensor, op: str, prescale: float = 1.0, postscale: float = 1.0
) -> torch.Tensor:
    """`flat` (1-D) reduced over every rank, as a new tensor on the backend's device."""
    buf = flat.detach().to(comm_device(), copy=True)
    negotiate("allreduce", buf.numel(), buf.dtype, op)
    if prescale != 1.0:
        buf.mul_(prescale)
    if size() > 1:
        dist.all_reduce(buf, op=reduce_op(op))
    if op == Average:
        postscale = postscale / size()
    if postscale != 1.0:
        buf.mul_(postscale)
    return buf


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """The reduction (Average by default; Sum, Min, Max, Product) of `tensor` over every rank,
    as a new tensor of its shape, dtype and device; `tensor` is not changed. An integer tensor
    is averaged in integers, as Horovod does (truncated)."""
    only_global(process_set)
    chosen = _op(op, average)
    compressed, ctx = compression.compress(tensor)
    flat = compressed.reshape(-1)
    if chosen == Average and not (flat.is_floating_point() or flat.is_complex()):
        summed = reduce_flat(flat, Sum, prescale_factor, postscale_factor)
        out = (summed.double() / size()).trunc().to(flat.dtype)
    else:
        out = reduce_flat(flat, chosen, prescale_factor, postscale_factor)
    result = out.reshape(compressed.shape).to(tensor.device)
    return compression.decompress(result, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """`allreduce`, written into `tensor`; returns it."""
    with torch.no_grad():
        tensor.copy_(
            allreduce(
                tensor,
                average,
                name,
                Compression.none,
                op,
                prescale_factor,
                postscale_factor,
                process_set,
            )
        )
    return tensor


def allreduce_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return _handle(allreduce(tensor, *args, **kwargs))


def allreduce_async_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return _handle(allreduce_(tensor, *args, **kwargs))


def grouped_allreduce(
    tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any
) -> list[torch.Tensor]:
    return [allreduce(t, *args, **kwargs) for t in tensors]


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any
) -> list[torch.Tensor]:
    return [allreduce_(t, *args, **kwargs) for t in tensors]


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> int:
    return _handle(grouped_allreduce(tensors, *args, **kwargs))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> int:
    return _handle(grouped_allreduce_(tensors, *args, **kwargs))


def _gather_ragged(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's `tensor` (its first dimension may differ), in rank order, on the CPU or
    the backend's device."""
    t = tensor.detach().reshape(tensor.shape or (1,)).to(comm_device())
    lengths = [torch.zeros(1, dtype=torch.long, device=t.device) for _ in range(size())]
    dist.all_gather(lengths, torch.tensor([t.shape[0]], device=t.device))
    longest = int(max(int(n.item()) for n in lengths))
    padded = torch.zeros((longest, *t.shape[1:]), dtype=t.dtype, device=t.device)
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(size())]
    dist.all_gather(parts, padded)
    return [p[: int(n.item())] for p, n in zip(parts, lengths, strict=True)]


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the first dimension, in rank order; the first
    dimension may differ between ranks (the others may not)."""
    only_global(process_set)
    negotiate("allgather")
    if size() == 1:
        return tensor.detach().clone()
    return torch.cat(_gather_ragged(tensor)).to(tensor.device)


def allgather_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return _handle(allgather(tensor, *args, **kwargs))


def grouped_allgather(
    tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any
) -> list[torch.Tensor]:
    return [allgather(t, *args, **kwargs) for t in tensors]


def grouped_allgather_async(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> int:
    return _handle(grouped_allgather(tensors, *args, **kwargs))


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """`root_rank`'s `tensor`, on every rank, as a new tensor."""
    only_global(process_set)
    negotiate("broadcast")
    if size() == 1:
        return tensor.detach().clone()
    buf = tensor.detach().to(comm_device(), copy=True)
    dist.broadcast(buf, src=root_rank)
    return buf.to(tensor.device)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """`broadcast`, written into `tensor`; returns it."""
    with torch.no_grad():
        tensor.copy_(broadcast(tensor, root_rank, name, process_set))
    return tensor


def broadcast_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return _handle(broadcast(tensor, *args, **kwargs))


def broadcast_async_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return _handle(broadcast_(tensor, *args, **kwargs))


def alltoall(
    tensor: torch.Tensor,
    splits: torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r sends the r-th slice of `tensor`'s first dimension (sizes `splits`, even when
    None) to each rank; returns what this rank received, in rank order, and its sizes."""
    only_global(process_set)
    negotiate("alltoall")
    n = size()
    first = tensor.shape[0] if tensor.dim() else 1
    if splits is None:
        if first % n:
            raise ValueError(f"alltoall of {first} rows over {n} ranks: give splits")
        splits = torch.full((n,), first // n, dtype=torch.int32)
    counts = [int(s) for s in splits.tolist()]
    if len(counts) != n or sum(counts) != first or min(counts) < 0:
        raise ValueError(f"alltoall splits {counts}: {n} sizes >= 0 adding up to {first}")
    if n == 1:
        return tensor.detach().clone(), torch.tensor(counts, dtype=torch.int32)
    me = dist.get_rank()
    everyone = _gather_ragged(tensor)
    all_splits = _gather_ragged(torch.tensor([counts], dtype=torch.long))
    mine = []
    for r, (part, their) in enumerate(zip(everyone, all_splits, strict=True)):
        start = int(their[0][:me].sum())
        mine.append(part[start : start + int(their[0][me])])
        del r
    received = torch.tensor([len(p) for p in mine], dtype=torch.int32)
    return torch.cat(mine).to(tensor.device), received


def alltoall_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return _handle(alltoall(tensor, *args, **kwargs))


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: str = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """The reduction of `tensor` over every rank, split along its first dimension as Horovod
    splits it (the first ``rows % size`` ranks get one row more): this rank's part."""
    reduced = allreduce(
        tensor, None, name, compression, op, prescale_factor, postscale_factor, process_set
    )
    n, me = size(), dist.get_rank() if size() > 1 else 0
    rows = reduced.shape[0]
    sizes = [rows // n + (1 if r < rows % n else 0) for r in range(n)]
    start = sum(sizes[:me])
    return reduced[start : start + sizes[me]].clone()


def reducescatter_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return _handle(reducescatter(tensor, *args, **kwargs))


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any
) -> list[torch.Tensor]:
    return [reducescatter(t, *args, **kwargs) for t in tensors]


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> int:
    return _handle(grouped_reducescatter(tensors, *args, **kwargs))


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait for every rank."""
    only_global(process_set)
    negotiate("barrier")
    if size() > 1:
        dist.barrier()


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """`root_rank`'s picklable `obj`, on every rank."""
    only_global(process_set)
    negotiate("object")
    if size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Every rank's picklable `obj`, in rank order."""
    only_global(process_set)
    negotiate("object")
    if size() == 1:
        return [obj]
    out: list[Any] = [None] * size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], root_rank: int
) -> None:
    """Overwrite, in place, each of `params` (a ``state_dict()`` or ``named_parameters()``)
    with `root_rank`'s."""
    items = sorted(params.items() if isinstance(params, Mapping) else params, key=lambda kv: kv[0])
    for name, value in items:
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name!r} is not a tensor")
        broadcast_(value, root_rank)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Give every rank `root_rank`'s optimizer state (its moments, step counts and
    hyperparameters). As Horovod does, an optimizer with no state yet first takes one step with
    zero gradients (not reduced) to make it: an Adam then counts that step."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state: torch.optim.LBFGS's state is not supported")
    if not optimizer.state_dict()["state"]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    zeros = torch.zeros_like(p)
                    sparse = isinstance(optimizer, torch.optim.SparseAdam)
                    p.grad = zeros.to_sparse() if sparse else zeros
        skip = getattr(optimizer, "skip_synchronize", None)  # a DistributedOptimizer's
        with skip() if skip is not None else contextlib.nullcontext():
            optimizer.step()
        if not optimizer.state_dict()["state"]:
            return  # a stateless optimizer: nothing to give
    optimizer.load_state_dict(broadcast_object(optimizer.state_dict(), root_rank))
