"""The world of a Horovod-style job on torch.distributed: who this process is, what is built,
the reduce operations, and the negotiation every collective starts with, which lets a rank that
called `join` take part in the allreduces of the ranks that still have data (as Horovod's
coordinator does).

Negotiation: before each collective, every rank gathers one small row from each (``active``,
the collective's kind, its element count, dtype and reduce op, and for a joined rank whether it
joined in this round). Ranks that joined answer an allreduce with zeros of the same size (the
average stays over every rank, as in Horovod); any other collective while a rank has joined is
refused on every rank, as Horovod refuses it; collectives of different kinds or sizes at the
same point on different ranks fail with the two they are, instead of a hang or a wrong sum.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from cloudtrain.runtime import dist as group

__all__ = [
    "Adasum",
    "Average",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "Product",
    "Sum",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "rocm_built",
    "shutdown",
    "size",
]


class HorovodInternalError(RuntimeError):
    """A collective could not run (Horovod's name: scripts catch it)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed (``hvd.elastic``: `State.check_host_updates` raises it on
    every rank at once). `skip_sync`: only hosts were removed, the survivors agree already."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the job's hosts were updated")
        self.skip_sync = skip_sync


#: The reduce operations, by Horovod's names. Adasum is named so that scripts that test for it
#: import; using it is refused (`check_op`).
Average, Sum, Adasum, Min, Max, Product = "average", "sum", "adasum", "min", "max", "product"
OPS = (Average, Sum, Min, Max, Product)
_REDUCE = {
    Sum: dist.ReduceOp.SUM,
    Average: dist.ReduceOp.SUM,
    Min: dist.ReduceOp.MIN,
    Max: dist.ReduceOp.MAX,
    Product: dist.ReduceOp.PRODUCT,
}


def check_op(op: str) -> str:
    """`op` when it is one this API reduces with; ValueError naming it otherwise."""
    if op == Adasum:
        raise ValueError(
            "op hvd.Adasum: cloudtrain.runtime.hvd does not implement Adasum; use hvd.Average "
            "or hvd.Sum (or --runtime horovod with Horovod itself)"
        )
    if op not in OPS:
        raise ValueError(f"op {op!r}: use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product")
    return op


def reduce_op(op: str) -> Any:
    """torch.distributed's reduce operation for `op` (after `check_op`)."""
    return _REDUCE[check_op(op)]


def init(comm: object = None, process_sets: object = None) -> None:
    """Join the job's process group (`cloudtrain.runtime.init`). Idempotent. Horovod's `comm`
    (an MPI communicator or a list of ranks) and `process_sets` are not supported here."""
    global _joined
    if comm or process_sets:
        raise ValueError("hvd.init(comm=..., process_sets=...): only the global set is supported")
    group.init()
    _joined = False


def shutdown() -> None:
    group.shutdown()


def is_initialized() -> bool:
    return dist.is_initialized()


def rank() -> int:
    return group.rank()


def size() -> int:
    return group.world_size()


def local_rank() -> int:
    return group.local_rank()


def _env(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw.isdigit() else default


def local_size() -> int:
    """How many processes run on this node (torchrun's ``LOCAL_WORLD_SIZE``)."""
    return _env("LOCAL_WORLD_SIZE", 1)


def cross_rank() -> int:
    """This node's rank among the nodes (torchrun's ``GROUP_RANK``)."""
    return _env("GROUP_RANK", 0)


def cross_size() -> int:
    """How many nodes the job has."""
    return max(1, size() // max(1, local_size()))


def is_homogeneous() -> bool:
    """True: torchrun starts the same number of workers on every node."""
    return True


def mpi_threads_supported() -> bool:
    """Raises ValueError, as Horovod does without MPI."""
    raise ValueError("Horovod MPI is not enabled here: cloudtrain.runtime.hvd runs on gloo/nccl")


def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def gloo_built() -> bool:
    return dist.is_gloo_available()


def gloo_enabled() -> bool:
    return dist.is_initialized() and dist.get_backend() == "gloo"


def nccl_built() -> bool:
    return dist.is_nccl_available() and torch.cuda.is_available()


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return torch.version.cuda is not None


def rocm_built() -> bool:
    return getattr(torch.version, "hip", None) is not None


# --- negotiation (see the module's docstring) ---------------------------------------------------

KINDS = ("join", "allreduce", "allgather", "broadcast", "barrier", "alltoall", "object")
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_joined = False  # this rank called join() and has not come back from it


def comm_device() -> torch.device:
    """Where the backend reduces: the GPU for nccl, else the CPU."""
    return group.device() if dist.get_backend() == "nccl" else torch.device("cpu")


def _gather(row: list[int]) -> list[list[int]]:
    mine = torch.tensor(row, dtype=torch.long, device=comm_device())
    rows = [torch.empty_like(mine) for _ in range(size())]
    dist.all_gather(rows, mine)
    return [[int(v) for v in r.tolist()] for r in rows]


def negotiate(kind: str, numel: int = 0, dtype: torch.dtype | None = None, op: str = Sum) -> None:
    """Agree with every rank on the collective about to run (see the module's docstring).
    Collective; raises HorovodInternalError when it cannot run as asked."""
    if size() == 1:
        return
    code = DTYPES.index(dtype) if dtype is not None else -1
    rows = _gather([1, KINDS.index(kind), numel, code, OPS.index(op), -1])
    _check(rows, kind)


def _describe(row: list[int]) -> str:
    kind = KINDS[row[1]]
    if kind != "allreduce":
        return f"hvd.{kind}"
    return f"an allreduce of {row[2]} {DTYPES[row[3]]} ({OPS[row[4]]})"


def _check(rows: list[list[int]], kind: str) -> None:
    active = [(r, row) for r, row in enumerate(rows) if row[0] == 1]
    joined = [r for r, row in enumerate(rows) if row[0] == 0]
    first = active[0][1]
    for r, row in active:
        if row[1:5] != first[1:5]:
            raise HorovodInternalError(
                f"ranks disagree on the collective: rank {active[0][0]} runs "
                f"{_describe(first)}, rank {r} {_describe(row)}"
            )
    if joined and (KINDS[first[1]] != "allreduce" or OPS[first[4]] not in (Sum, Average)):
        raise HorovodInternalError(
            f"{_describe(first)} while rank(s) {joined} have joined: only a sum or average "
            "allreduce runs then (as in Horovod)"
        )


def join(device: int = -1) -> int:
    """This rank has no more data: until every rank has joined, take part in the others'
    allreduces with zeros. Returns the rank that joined last (of those that joined in the same
    round, the highest). Collective; blocks."""
    global _joined
    if size() == 1:
        return rank()
    _joined, newly = True, True
    try:
        while True:
            rows = _gather([0, 0, 0, 0, 0, rank() if newly else -1])
            newly = False
            if all(row[0] == 0 for row in rows):
                return max(row[5] for row in rows)
            _check(rows, "join")
            first = next(row for row in rows if row[0] == 1)
            zeros = torch.zeros(first[2], dtype=DTYPES[first[3]], device=comm_device())
            dist.all_reduce(zeros, op=dist.ReduceOp.SUM)
    finally:
        _joined = False
