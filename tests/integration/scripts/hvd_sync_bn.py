"""`hvd.SyncBatchNorm` on two ranks that hold batches of different sizes, checked against one
`torch.nn.BatchNorm` over the whole batch in each process (outputs, input gradients, weight
and bias gradients summed over the ranks, running statistics, with ``momentum`` and with the
cumulative average), then a small model with it trained through `hvd.DistributedOptimizer`."""

from __future__ import annotations

import torch
from torch import nn

import cloudtrain.runtime.hvd as hvd

hvd.init()
torch.set_num_threads(1)
me, n = hvd.rank(), hvd.size()
assert n == 2, n
worst = 0.0


def differ(a: torch.Tensor, b: torch.Tensor) -> None:
    global worst
    worst = max(worst, float((a - b).detach().abs().max()))


def check(dims: int, momentum: float | None) -> None:
    shape = (12, 3, *(4, 5)[: dims - 2])
    whole = torch.randn(*shape, generator=torch.Generator().manual_seed(dims)) * 3 + 1
    looks = torch.randn(*shape, generator=torch.Generator().manual_seed(9))
    cut = 5  # rank 0 holds 5 samples, rank 1 the other 7
    mine = slice(0, cut) if me == 0 else slice(cut, None)
    kind = nn.BatchNorm1d if dims < 4 else nn.BatchNorm2d
    reference = kind(3, momentum=momentum)
    synced = hvd.SyncBatchNorm(3, momentum=momentum)
    with torch.no_grad():
        for bn in (reference, synced):
            bn.weight.copy_(torch.tensor([1.5, -0.5, 2.0]))
            bn.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
    for _ in range(3):  # three batches: the running statistics move
        full = whole.clone().requires_grad_(True)
        part = whole[mine].clone().requires_grad_(True)
        out_full = reference(full)
        out_part = synced(part)
        (out_full * looks).sum().backward()
        (out_part * looks[mine]).sum().backward()
        differ(out_part, out_full[mine])
        assert full.grad is not None
        assert part.grad is not None
        differ(part.grad, full.grad[mine])
        for ours, theirs in ((synced.weight, reference.weight), (synced.bias, reference.bias)):
            assert ours.grad is not None
            assert theirs.grad is not None
            differ(hvd.allreduce(ours.grad, op=hvd.Sum), theirs.grad)
            ours.grad, theirs.grad = None, None
        whole = whole * 0.5 + 0.25
    for kept, expected in (
        (synced.running_mean, reference.running_mean),
        (synced.running_var, reference.running_var),
    ):
        assert kept is not None
        assert expected is not None
        differ(kept, expected)
    synced.eval()
    reference.eval()
    differ(synced(whole), reference(whole))


for dims in (2, 3, 4):
    for momentum in (0.1, None):
        check(dims, momentum)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), hvd.SyncBatchNorm(16), nn.ReLU(), nn.Linear(16, 2))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.randn(64, 6, generator=torch.Generator().manual_seed(3))
y = (x[:, 0] > 0).long()
shard = slice(me * 32, (me + 1) * 32)
first = last = 0.0
for step in range(30):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x[shard]), y[shard])
    loss.backward()
    optimizer.step()
    value = float(hvd.allreduce(loss.detach()))
    first, last = (value, value) if step == 0 else (first, value)
state = [t.detach().clone() for t in model.state_dict().values()]
agree = all(bool(torch.equal(t, hvd.broadcast(t, root_rank=0))) for t in state)
print(f"rank {me} of {n}: syncbn worst difference {worst:.2e}", flush=True)
print(f"rank {me}: trained loss {first:.4f} -> {last:.4f} ranks agree {agree}", flush=True)
