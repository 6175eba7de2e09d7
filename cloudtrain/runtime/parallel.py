"""Wrap a model for data-parallel training: DDP, or FSDP2 (``fully_shard``).

The strategy is the job's: ``cloudtrain train --strategy fsdp`` sets ``$CLOUDTRAIN_STRATEGY``
on every node, `strategy()` reads it, and ``wrap(model)`` uses it, so one script runs either way.

FSDP on CPU and glibc's allocator: FSDP gathers each unit's full parameters for its forward and
backward and reduce-scatters its full-size gradients, buffers that live for one unit's turn. On
CPU they come from malloc. glibc serves a large request by mmap and unmaps it when freed, but
after the first such free it raises its threshold to that size (up to 32 MiB), so the next
gathers are carved from the heap and kept there when freed, one heap per thread that
allocated: each rank held more memory than under DDP, which FSDP was meant to save (674 MiB
against 512 MiB peak on `examples/digits_fsdp.py`). `wrap` pins the threshold for FSDP on CPU
(`mallopt(M_MMAP_THRESHOLD, ...)`, glibc only; not when the user set one: ``MALLOC_MMAP_THRESHOLD_``
or ``GLIBC_TUNABLES``), so every such buffer goes back to the system when freed.
``bench/fsdp_memory.py`` measures both strategies.
"""

from __future__ import annotations

import ctypes
import logging
import os

from torch import nn

from cloudtrain.runtime.dist import _require_group, device, local_rank, world_size
from cloudtrain.spec.frameworks import STRATEGIES

__all__ = ["STRATEGIES", "STRATEGY_ENV", "strategy", "wrap"]

log = logging.getLogger(__name__)

#: The variable that names the job's strategy (one of `STRATEGIES`; unset or empty: ddp).
STRATEGY_ENV = "CLOUDTRAIN_STRATEGY"
#: From this size up, FSDP's buffers on CPU are mmapped, and unmapped when freed (glibc's own
#: default threshold, made fixed: see the module's docstring).
MMAP_THRESHOLD = 128 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def strategy() -> str:
    """The job's strategy: ``$CLOUDTRAIN_STRATEGY``, ``"ddp"`` when unset or empty.

    Reads the environment on every call (no caching). Raises ValueError naming the variable,
    its value and the allowed values when it holds anything else.
    """
    raw = os.environ.get(STRATEGY_ENV, "")
    if raw == "":
        return "ddp"
    if raw not in STRATEGIES:
        raise ValueError(
            f"environment variable {STRATEGY_ENV}={raw!r} is not a strategy; "
            f"allowed: {', '.join(STRATEGIES)}"
        )
    return raw


_job_strategy = strategy  # `wrap`'s parameter shadows the function's name


def wrap(model: nn.Module, strategy: str | None = None) -> nn.Module:
    """Move `model` to `device()` and wrap it for data parallelism. Call after `init`.

    `strategy` None means the job's, `strategy()`. ``"ddp"``: DistributedDataParallel
    (``device_ids=[LOCAL_RANK]`` on GPU); the original model is ``wrapped.module``. ``"fsdp"``:
    FSDP2 ``fully_shard`` over a 1-D mesh of all ranks, applied to the root module in place
    (works on CPU/gloo too, unlike FSDP1); shard submodules yourself first for per-layer
    sharding. Raises ValueError for another strategy (or a bad ``$CLOUDTRAIN_STRATEGY``) and
    RuntimeError when no process group is initialised.
    """
    chosen = _job_strategy() if strategy is None else strategy
    if chosen not in STRATEGIES:
        raise ValueError(f"unknown strategy {chosen!r}; allowed: {', '.join(STRATEGIES)}")
    _require_group()
    dev = device()
    model = model.to(dev)
    if chosen == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if dev.type == "cuda":
            return DistributedDataParallel(model, device_ids=[local_rank()])
        return DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if dev.type == "cpu":
        _pin_mmap_threshold()
    mesh = init_device_mesh(dev.type, (world_size(),))
    fully_shard(model, mesh=mesh)  # in place: `model` becomes an FSDPModule
    return model


def _pin_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at `MMAP_THRESHOLD` (see the module's docstring); whether it
    was set. Does nothing where the user set one or where the C library is not glibc."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "malloc.mmap_threshold" in tunables:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to pin
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1)
    if done:
        log.debug("glibc's mmap threshold fixed at %d bytes", MMAP_THRESHOLD)
    return done
