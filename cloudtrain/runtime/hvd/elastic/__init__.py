"""Horovod's elastic API (``hvd.elastic``) on cloudtrain's world, for scripts written the way
Horovod's ``examples/elastic/pytorch`` are::

    state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
    state.register_reset_callbacks([on_state_reset])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs + 1):
            ...
            state.commit()

    train(state)

`run` does what Horovod's does: it synchronises the state from rank 0, calls the function,
and when a collective fails (`HorovodInternalError`, or torch.distributed's own ``DistError``)
restores the last commit, resets the world (`reset`: leave the process group, join it
again), runs the reset callbacks, synchronises and calls the function again; on a
`HostsUpdatedInterrupt` it resets without restoring. What differs, on purpose: the job's
membership is torchrun's. When a node is lost or one joins (``--min-nodes``), torchrun's agents
restart the workers, so the committed state in memory does not outlive that; a training that
must, saves checkpoints (`cloudtrain.runtime.checkpoint`), which a managed job resumes from.
No notification of hosts arrives from the launcher: `State.check_host_updates` raises for
those the script posts itself (`State.on_hosts_updated`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

from cloudtrain.runtime import dist as group
from cloudtrain.runtime.hvd.basics import HorovodInternalError, HostsUpdatedInterrupt, init
from cloudtrain.runtime.hvd.elastic.sampler import ElasticSampler
from cloudtrain.runtime.hvd.elastic.state import HostUpdateResult, ObjectState, State, TorchState

__all__ = [
    "ElasticSampler",
    "HostUpdateResult",
    "ObjectState",
    "State",
    "TorchState",
    "reset",
    "run",
]

R = TypeVar("R")

#: How long a reset waits for every rank to join the new group.
RESET_TIMEOUT_S = 300
_resets = 0  # how many resets this process made: the store prefix of the next group


def reset() -> None:
    """Leave the process group and join it again (every rank does, after the same failure or
    interrupt). A group that cannot agree to leave (a rank is gone) is torn down here alone.

    The new group meets on torchrun's store under a prefix of its own (the reset's number):
    torch names a group made after the default one was destroyed as it named the first, and
    its rendezvous would read the first one's stale addresses and hang."""
    global _resets
    backend = dist.get_backend() if dist.is_initialized() else None
    try:
        group.shutdown()
    except (RuntimeError, dist.DistError):
        if dist.is_initialized():
            dist.destroy_process_group()
    if backend is None or "MASTER_ADDR" not in os.environ:
        init()  # not under torchrun: a group of one, on a store of its own
        return
    _resets += 1
    store = dist.TCPStore(  # type: ignore[attr-defined]  # exported off Windows only
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=RESET_TIMEOUT_S),
    )
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"cloudtrain/hvd-reset/{_resets}", store),  # type: ignore[attr-defined]
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=RESET_TIMEOUT_S),
    )


def run(func: Callable[..., R]) -> Callable[..., R]:
    """`func(state, ...)` run elastically (see the module). The first argument must be a
    `State`. Collective: no collective may run before `func` is called."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except (HorovodInternalError, dist.DistError):
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
            reset()
            state.on_reset()

    return wrapper
