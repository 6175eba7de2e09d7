"""Wrap a model for data-parallel training: DDP, or FSDP2 (``fully_shard``).

The strategy is the job's: ``cloudtrain train --strategy fsdp`` sets ``$CLOUDTRAIN_STRATEGY``
on every node, `strategy()` reads it, and ``wrap(model)`` uses it, so one script runs either way.
"""

from __future__ import annotations

import os

from torch import nn

from cloudtrain.runtime.dist import _require_group, device, local_rank, world_size
from cloudtrain.spec.frameworks import STRATEGIES

__all__ = ["STRATEGIES", "STRATEGY_ENV", "strategy", "wrap"]

#: The variable that names the job's strategy (one of `STRATEGIES`; unset or empty: ddp).
STRATEGY_ENV = "CLOUDTRAIN_STRATEGY"


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

    mesh = init_device_mesh(dev.type, (world_size(),))
    fully_shard(model, mesh=mesh)  # in place: `model` becomes an FSDPModule
    return model
