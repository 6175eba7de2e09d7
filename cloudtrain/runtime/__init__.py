"""The node-side runtime a training script imports: ``from cloudtrain import runtime``.

    runtime.init()                          # process group from torchrun's env (or a group of 1)
    sampler = runtime.BalancedSampler(dataset)
    model = runtime.wrap(model)             # the job's strategy(): "ddp", or "fsdp" (FSDP2)
    loss = runtime.average(loss.item())     # mean over all replicas
    runtime.step()                          # once per optimizer step: the job's progress
    runtime.report(step=epoch, loss=loss)   # numbers kept with the job: `cloudtrain metrics`
    runtime.save_checkpoint(runtime.checkpoint_dir() / "last.pt", state)
    runtime.save_sharded(runtime.checkpoint_dir() / "run", model, optimizer)  # FSDP: DCP shards
    runtime.on_preemption(lambda: save_and_stop())   # the cloud's notice, a minute ahead

Importing this package imports torch; ``import cloudtrain`` alone does not. The sharded
checkpoints (`save_sharded`, `load_sharded`) load on first use: their module imports torch's
distributed checkpoint package, about 1 s of CPU that every worker of a DDP job would pay at
start for nothing.
"""

from typing import TYPE_CHECKING, Any

from cloudtrain.runtime.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    load_checkpoint,
    save_checkpoint,
)
from cloudtrain.runtime.dist import (
    average,
    barrier,
    device,
    init,
    is_main,
    local_rank,
    rank,
    shutdown,
    world_size,
)
from cloudtrain.runtime.metrics import report
from cloudtrain.runtime.parallel import STRATEGIES, strategy, wrap
from cloudtrain.runtime.preemption import on_preemption, preempting
from cloudtrain.runtime.progress import step
from cloudtrain.runtime.sampler import BalancedSampler

if TYPE_CHECKING:
    from cloudtrain.runtime.sharded import load_sharded, save_sharded

_LAZY = {"load_sharded", "save_sharded"}


def __getattr__(name: str) -> Any:
    """`load_sharded` and `save_sharded`, imported when first asked for (PEP 562)."""
    if name in _LAZY:
        from cloudtrain.runtime import sharded

        return getattr(sharded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "STRATEGIES",
    "BalancedSampler",
    "CheckpointError",
    "average",
    "barrier",
    "checkpoint_dir",
    "device",
    "init",
    "is_main",
    "load_checkpoint",
    "load_sharded",
    "local_rank",
    "on_preemption",
    "preempting",
    "rank",
    "report",
    "save_checkpoint",
    "save_sharded",
    "shutdown",
    "step",
    "strategy",
    "world_size",
    "wrap",
]
