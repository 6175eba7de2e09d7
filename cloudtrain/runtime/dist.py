"""The process group and the rank/world helpers a training script uses on a node.

Under torchrun, `init()` builds the process group from torchrun's env (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). Without torchrun (plain ``python train.py``) it
builds a one-process group on an in-memory store, so `wrap`, `average` and barriers behave the
same in both cases and a script needs no ``if distributed:`` branches.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import overload

import torch
import torch.distributed as dist

from cloudtrain.jobs import launched

log = logging.getLogger(__name__)

__all__ = [
    "average",
    "barrier",
    "device",
    "init",
    "is_main",
    "local_rank",
    "rank",
    "shutdown",
    "world_size",
]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(backend: str | None = None, timeout_s: float = 300) -> None:
    """Join the job's process group. Idempotent; blocks until every rank has joined.

    `backend` defaults to nccl when CUDA is available (and the CUDA device is set to
    ``LOCAL_RANK``), gloo otherwise. Without torchrun's env a one-process group is made
    (world size 1, rank 0). Raises what torch raises when the rendezvous fails or times out, and
    `cloudtrain.jobs.launched.WrongRuntimeError` (a SystemExit) when TensorFlow's or Horovod's
    workers run it: each would be a world of one.
    """
    if dist.is_initialized():
        return
    launched.check_torch_group()  # another runtime's workers: each would be a world of one
    cuda = torch.cuda.is_available()
    chosen = backend or ("nccl" if cuda else "gloo")
    timeout = timedelta(seconds=timeout_s)
    device_id: torch.device | None = None
    if cuda:
        local = local_rank()
        count = torch.cuda.device_count()
        if local >= count:
            raise RuntimeError(f"LOCAL_RANK={local} but this node has only {count} CUDA device(s)")
        torch.cuda.set_device(local)
        if chosen == "nccl":
            device_id = torch.device("cuda", local)
    if _under_torchrun():
        dist.init_process_group(chosen, timeout=timeout, device_id=device_id)
    else:
        store = dist.HashStore()  # type: ignore[attr-defined]  # exported off Windows only
        dist.init_process_group(
            chosen, store=store, rank=0, world_size=1, timeout=timeout, device_id=device_id
        )
    log.info(
        "process group ready: backend=%s rank=%d/%d local_rank=%d",
        chosen,
        rank(),
        world_size(),
        local_rank(),
    )


#: The work of the last gloo barrier `shutdown` waited on (see there).
_last_barrier: object = None


def shutdown() -> None:
    """Leave and destroy the process group, once every rank got here (a rank that tears its
    group down while another is still talking to it can abort the other). Idempotent.

    Under gloo, the barrier's work is kept until the next `shutdown` (`_last_barrier`).
    Otherwise gloo's worker thread drops the last reference to it, and with it to the works of
    the last backward pass, which hold the Python context torch's autograd stashed in their
    thread-local state: freeing that needs the GIL. A DDP model still holds the group, so the
    group's destructor runs later, when the script frees the model, and it joins that worker
    thread *with* the GIL held: a process that never exits (seen in about one run in four on 2
    busy cores, torch 2.13). Kept here, the work is freed on the main thread. What it keeps
    alive is the last backward's gradient buckets (CPU memory, 25 MiB each by DDP's default).
    """
    global _last_barrier
    if dist.is_initialized():
        if dist.get_world_size() > 1:
            work = dist.barrier(async_op=True)
            assert work is not None  # async_op=True: always a work
            work.wait()
            if dist.get_backend() == "gloo":
                _last_barrier = work
        dist.destroy_process_group()


def rank() -> int:
    """This process's global rank: from the group once `init` ran, else ``$RANK`` (default 0)."""
    if dist.is_initialized():
        return dist.get_rank()
    return _env_int("RANK", 0)


def local_rank() -> int:
    """This process's rank on its node: ``$LOCAL_RANK`` (default 0)."""
    return _env_int("LOCAL_RANK", 0)


def world_size() -> int:
    """How many processes the job has: from the group, else ``$WORLD_SIZE`` (default 1)."""
    if dist.is_initialized():
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def is_main() -> bool:
    """True on global rank 0, the process that prints and reports."""
    return rank() == 0


def device() -> torch.device:
    """The device this process computes on: ``cuda:LOCAL_RANK`` when CUDA is available, else cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


def barrier() -> None:
    """Wait for every rank. A no-op when no group is initialised or the world is one process."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _require_group() -> None:
    if not dist.is_initialized():
        raise RuntimeError(
            f"no process group (WORLD_SIZE={world_size()}): call cloudtrain.runtime.init() first"
        )


@overload
def average(x: torch.Tensor) -> torch.Tensor: ...
@overload
def average(x: float) -> float: ...
def average(x: torch.Tensor | float) -> torch.Tensor | float:
    """The mean of `x` over all replicas (all_reduce SUM / world size). Collective: blocks.

    A float gives a float; a tensor gives a tensor on x's device, detached from autograd
    (integer tensors are averaged as the default float dtype). With one process the value comes
    back as is, without communication. Raises RuntimeError when the world has more than one
    process but `init` was not called.
    """
    n = world_size()
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if not (t.is_floating_point() or t.is_complex()):
            t = t.to(torch.get_default_dtype())
        if n == 1:
            return t
        buf = _all_reduce_sum(t)
        return (buf / n).to(x.device)
    value = float(x)
    if n == 1:
        return value
    return float(_all_reduce_sum(torch.tensor([value], dtype=torch.float64)).item()) / n


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum `t` over all ranks into a new tensor on the backend's device."""
    _require_group()
    comm = device() if dist.get_backend() == "nccl" else torch.device("cpu")
    buf = t.to(comm, copy=True)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    return buf
