"""Wrap a model for data-parallel training: DDP, or FSDP2 (``fully_shard``)."""

from __future__ import annotations

from torch import nn

from cloudtrain.runtime.dist import _require_group, device, local_rank, world_size

__all__ = ["STRATEGIES", "wrap"]

STRATEGIES = ("ddp", "fsdp")


def wrap(model: nn.Module, strategy: str = "ddp") -> nn.Module:
    """Move `model` to `device()` and wrap it for data parallelism. Call after `init`.

    ``"ddp"``: DistributedDataParallel (``device_ids=[LOCAL_RANK]`` on GPU); the original
    model is ``wrapped.module``. ``"fsdp"``: FSDP2 ``fully_shard`` over a 1-D mesh of all ranks,
    applied to the root module in place (works on CPU/gloo too, unlike FSDP1); shard submodules
    yourself first for per-layer sharding. Raises ValueError for another strategy and
    RuntimeError when no process group is initialised.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}")
    _require_group()
    dev = device()
    model = model.to(dev)
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if dev.type == "cuda":
            return DistributedDataParallel(model, device_ids=[local_rank()])
        return DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(dev.type, (world_size(),))
    fully_shard(model, mesh=mesh)  # in place: `model` becomes an FSDPModule
    return model
