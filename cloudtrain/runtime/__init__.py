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

Importing this package does not import torch: `report`, `step`, `on_preemption` and
`preempting` are stdlib only (a TensorFlow or Horovod script reports its metrics with them),
and the rest load with their module on first use (``from cloudtrain.runtime import init``
or ``runtime.init``), which imports torch. The sharded checkpoints (`save_sharded`,
`load_sharded`) load apart from the others: their module imports torch's distributed
checkpoint package, about 1 s of CPU that every worker of a DDP job would pay at start for
nothing.
"""

import importlib
from typing import TYPE_CHECKING, Any

from cloudtrain.runtime.metrics import report
from cloudtrain.runtime.preemption import on_preemption, preempting
from cloudtrain.runtime.progress import step

if TYPE_CHECKING:
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
    from cloudtrain.runtime.parallel import STRATEGIES, strategy, wrap
    from cloudtrain.runtime.sampler import BalancedSampler
    from cloudtrain.runtime.sharded import load_sharded, save_sharded

#: The names that import torch, by the module that holds them: imported when first asked for.
_LAZY = {
    "checkpoint": ("CheckpointError", "checkpoint_dir", "load_checkpoint", "save_checkpoint"),
    "dist": (
        "average",
        "barrier",
        "device",
        "init",
        "is_main",
        "local_rank",
        "rank",
        "shutdown",
        "world_size",
    ),
    "parallel": ("STRATEGIES", "strategy", "wrap"),
    "sampler": ("BalancedSampler",),
    "sharded": ("load_sharded", "save_sharded"),
}
_HOME = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> Any:
    """A name that imports torch, from its module, when first asked for (PEP 562)."""
    if name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value  # asked once
        return value
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
