"""The node-side runtime a training script imports: ``from cloudtrain import runtime``.

    runtime.init()                          # process group from torchrun's env (or a group of 1)
    sampler = runtime.BalancedSampler(dataset)
    model = runtime.wrap(model, "ddp")      # or "fsdp" (FSDP2)
    loss = runtime.average(loss.item())     # mean over all replicas
    runtime.step()                          # once per optimizer step: the job's progress
    runtime.save_checkpoint(runtime.checkpoint_dir() / "last.pt", state)
    runtime.on_preemption(lambda: save_and_stop())   # the cloud's notice, a minute ahead

Importing this package imports torch; ``import cloudtrain`` alone does not.
"""

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
from cloudtrain.runtime.parallel import STRATEGIES, wrap
from cloudtrain.runtime.preemption import on_preemption, preempting
from cloudtrain.runtime.progress import step
from cloudtrain.runtime.sampler import BalancedSampler

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
    "local_rank",
    "on_preemption",
    "preempting",
    "rank",
    "save_checkpoint",
    "shutdown",
    "step",
    "world_size",
    "wrap",
]
