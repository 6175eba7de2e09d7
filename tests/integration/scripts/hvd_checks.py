"""Horovod's PyTorch API, exercised with fixed numbers on two ranks: each line it prints (rank 0)
must be the same under Horovod itself (``--runtime horovod``) and under cloudtrain's
`cloudtrain.runtime.hvd` (the torch runtime)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

if "HOROVOD_RANK" in os.environ:
    import horovod.torch as hvd  # type: ignore[import-not-found, unused-ignore]
else:
    import cloudtrain.runtime.hvd as hvd

out: list[str] = []


def show(name: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        value = [round(float(v), 5) for v in value.detach().double().reshape(-1).tolist()]
    out.append(f"{name}: {value}")


def train(op: Any, compression: Any, passes: int, steps: int, predivide: float = 1.0) -> nn.Module:
    torch.manual_seed(10 + hvd.rank())
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(
        opt,
        named_parameters=model.named_parameters(),
        compression=compression,
        backward_passes_per_step=passes,
        op=op,
        gradient_predivide_factor=predivide,
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for step in range(steps):
        opt.zero_grad()
        for micro in range(passes):
            x = torch.full((4, 3), 0.1 * (hvd.rank() + 1 + step + micro))
            y = torch.full((4, 2), 0.3 * (hvd.rank() - step))
            nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
    return model


def main() -> None:
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    show("world", [n, hvd.local_size(), hvd.cross_size(), hvd.is_initialized()])
    show("ranks", hvd.allgather(torch.tensor([me, hvd.local_rank(), hvd.cross_rank()])))
    t = torch.tensor([1.0 + me, -2.5 * me, 1 / 3])
    for op in ("Average", "Sum", "Min", "Max", "Product"):
        show(f"allreduce {op}", hvd.allreduce(t, op=getattr(hvd, op)))
    show("allreduce ints", hvd.allreduce(torch.tensor([3 * me - 4, 7 + me]), op=hvd.Average))
    show("allreduce average=False", hvd.allreduce(t, average=False))
    show("scaled", hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0))
    show("fp16", hvd.allreduce(t, compression=hvd.Compression.fp16, op=hvd.Sum))
    inplace = t.clone()
    hvd.allreduce_(inplace, op=hvd.Sum)
    show("allreduce_", inplace)
    show("async", hvd.synchronize(hvd.allreduce_async(t, op=hvd.Sum)))
    show("grouped", hvd.grouped_allreduce([t, t * 2], op=hvd.Sum)[1])
    show("allgather", hvd.allgather(torch.arange(me + 1) + 10 * me))
    show("broadcast", hvd.broadcast(t, root_rank=1))
    b = t.clone()
    hvd.broadcast_(b, root_rank=1)
    show("broadcast_", b)
    sent = torch.arange(6) + 100 * me
    got, sizes = hvd.alltoall(sent, splits=torch.tensor([2 + me, 4 - me], dtype=torch.int32))
    show("alltoall", got)
    show("alltoall sizes", sizes)
    show("reducescatter", hvd.reducescatter(torch.arange(10.0).reshape(5, 2) * (me + 1)))
    show("broadcast_object", hvd.broadcast_object({"from": me}, root_rank=1))
    show("allgather_object", hvd.allgather_object(("rank", me)))
    for name, op, comp, passes, pre in [
        ("sgd average", hvd.Average, hvd.Compression.none, 1, 1.0),
        ("sgd sum fp16", hvd.Sum, hvd.Compression.fp16, 1, 1.0),
        ("sgd 2 passes predivide", hvd.Average, hvd.Compression.none, 2, 2.0),
    ]:
        model = train(op, comp, passes, 4, pre)
        show(name, torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    # uneven data: rank 1 takes one step more, rank 0 joins and answers it with zeros
    show("flags", [hvd.mpi_built(), bool(hvd.gloo_built()), hvd.mpi_enabled()])
    if me == 0:
        print("\n".join(f"check {line}" for line in out), flush=True)
    model = train(hvd.Average, hvd.Compression.none, 1, 2 + me)
    last = hvd.join()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    out.clear()
    show(f"rank {me} after join (last {last})", weights)
    print(f"check {out[0]}", flush=True)


if __name__ == "__main__":
    main()
