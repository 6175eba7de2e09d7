"""Horovod's PyTorch API (``horovod.torch``) on torch.distributed, for scripts written the
Horovod way to run under cloudtrain's torchrun (the torch runtime)::

    import cloudtrain.runtime.hvd as hvd    # instead of: import horovod.torch as hvd

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    ...
    loss = hvd.allreduce(loss, op=hvd.Average)
    hvd.join()

The job is torchrun's (``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``…), the
group `cloudtrain.runtime.init`'s; under ``--runtime horovod`` (Horovod's own workers) `init`
refuses, naming the runtime to use. What is Horovod's and what differs, on purpose:

================================  =============================================================
world                             `init`, `shutdown`, `is_initialized`, `rank`, `size`,
                                  `local_rank`, `local_size`, `cross_rank`, `cross_size`, the
                                  ``*_built``/``*_enabled`` answers for this torch (no MPI)
collectives (`ops`)               allreduce, allgather (ragged first dimension), broadcast,
                                  alltoall, reducescatter, barrier, their in-place, grouped and
                                  ``_async`` forms (which run at once: `poll` is always True),
                                  `broadcast_object`, `allgather_object`, `broadcast_parameters`,
                                  `broadcast_optimizer_state`; ops Average, Sum, Min, Max,
                                  Product; ``prescale_factor``/``postscale_factor``; ``name`` is
                                  ignored (torch.distributed matches collectives by order)
`join`                            as Horovod's: a rank out of data answers the others'
                                  allreduces with zeros until all have joined; returns the rank
                                  that joined last (`basics`)
`DistributedOptimizer`            a subclass instance of the wrapped optimizer's class (LR
                                  schedulers take it), one flat allreduce per dtype at
                                  ``step()`` (`optimizer`); `Compression` none and fp16
`SyncBatchNorm`                   batch statistics over every rank's batch together, on the
                                  CPU too (Horovod's needs CUDA) (`sync_batch_norm`)
``elastic``                       `TorchState` (commit, restore, sync, reset callbacks), ``run``,
                                  `ElasticSampler`; membership changes are torchrun's, which
                                  restarts the workers (`elastic`)
refused with one line             Adasum, process sets other than the global one, MPI
                                  communicators, timelines
not provided                      ``sparse_allreduce_async``
================================  =============================================================
"""

from cloudtrain.runtime.hvd import elastic
from cloudtrain.runtime.hvd.basics import (
    Adasum,
    Average,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    Max,
    Min,
    Product,
    Sum,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
)
from cloudtrain.runtime.hvd.compression import Compression
from cloudtrain.runtime.hvd.ops import (
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    poll,
    reducescatter,
    reducescatter_async,
    synchronize,
)
from cloudtrain.runtime.hvd.optimizer import DistributedOptimizer
from cloudtrain.runtime.hvd.sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from cloudtrain.runtime.hvd.sync_batch_norm import SyncBatchNorm


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    raise ValueError(
        "hvd.start_timeline: Horovod's timeline is not available here; use torch.profiler"
    )


def stop_timeline() -> None:
    raise ValueError("hvd.stop_timeline: Horovod's timeline is not available here")


__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNorm",
    "add_process_set",
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
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]
