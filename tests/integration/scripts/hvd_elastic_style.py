"""A script written the way Horovod's examples/elastic/pytorch/pytorch_mnist_elastic.py (and
its cifar10 sibling's `ElasticSampler`) are: `hvd.elastic.TorchState` holding the model, the
optimizer, the sampler and the loop's counters, a reset callback that scales the learning rate,
``@hvd.elastic.run``, ``state.commit()`` after each batch. Synthetic data (no downloads).

``--fail-at-step N`` makes every rank raise `HorovodInternalError` once, after the N-th step's
update and before its commit, as a failed collective would: the state goes back to the last
commit, the world resets, and the step is done again, so the trained numbers are those of a run
without it. Under Horovod's own workers (``--runtime horovod``) it imports ``horovod.torch``
(real Horovod's ``@hvd.elastic.run`` needs no elastic driver on a plain gloo launch, and its
reset re-initialises there), so each figure it prints can be compared with Horovod's: each
rank's share of the epoch (first indices, length, position-weighted sum) whenever it enters
one, rank 0's mean loss per epoch, and each rank's parameter sum and position-weighted sum."""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn, optim

if "HOROVOD_RANK" in os.environ:
    import horovod.torch as hvd  # type: ignore[import-not-found, import-untyped, unused-ignore]
else:
    import cloudtrain.runtime.hvd as hvd

parser = argparse.ArgumentParser(description="elastic training, the Horovod way")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--fail-at-step", type=int, default=0)
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)

# 512 points in 8 dimensions, labelled by which of 4 fixed directions they lean to most
data = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
labels = (data @ torch.randn(8, 4, generator=torch.Generator().manual_seed(1))).argmax(1)
train_dataset = torch.utils.data.TensorDataset(data, labels)
train_sampler = hvd.elastic.ElasticSampler(train_dataset, shuffle=True, seed=7)
train_loader = torch.utils.data.DataLoader(
    train_dataset, batch_size=args.batch_size, sampler=train_sampler
)

model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
executed = {"steps": 0, "failed": False, "resets": 0}


@hvd.elastic.run
def train(state):  # type: ignore[no-untyped-def]
    for state.epoch in range(state.epoch, args.epochs + 1):  # noqa: B020  (Horovod's idiom)
        state.model.train()
        order = list(state.train_sampler)  # what this rank is dealt of the epoch's rest
        weighted = sum((at + 1) * i for at, i in enumerate(order))
        print(
            f"rank {hvd.rank()} epoch {state.epoch} order {order[:4]} {len(order)} {weighted}",
            flush=True,
        )
        total = 0.0
        for idx, (x, y) in enumerate(train_loader):
            state.optimizer.zero_grad()
            loss = F.cross_entropy(state.model(x), y)
            loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
            state.optimizer.step()
            state.steps += 1
            executed["steps"] += 1
            total += loss.item()
            if state.steps == args.fail_at_step and not executed["failed"]:
                executed["failed"] = True
                raise hvd.HorovodInternalError("a collective failed (simulated)")
            state.train_sampler.record_batch(idx, args.batch_size)
            state.commit()
        loss_avg = hvd.allreduce(torch.tensor(total / max(1, len(train_loader))), name="loss")
        if hvd.rank() == 0:
            print(f"epoch {state.epoch} loss {float(loss_avg):.6f}", flush=True)
        state.train_sampler.set_epoch(state.epoch)
        state.commit()


def on_state_reset() -> None:
    executed["resets"] += 1
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()
    print(f"rank {hvd.rank()}: reset, world of {hvd.size()}", flush=True)


state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=1, steps=0)
state.register_reset_callbacks([on_state_reset])
train(state)

flat = torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])
weights = torch.linspace(-1, 1, flat.numel(), dtype=torch.float64)  # order matters too
print(
    f"rank {hvd.rank()} of {hvd.size()}: steps {state.steps} executed {executed['steps']} "
    f"resets {executed['resets']} params {float(flat.sum()):.7f} {float(flat @ weights):.7f}",
    flush=True,
)
