"""The digits MLP written the way Horovod's documentation writes a PyTorch script.

    cloudtrain train -c demo examples/digits_hvd.py -- --epochs 5

It imports Horovod when Horovod started it (``--runtime horovod``: its workers have
``HOROVOD_RANK``), and cloudtrain's Horovod-style API on torch.distributed
(`cloudtrain.runtime.hvd`) otherwise: the same script, unchanged, under cloudtrain's torchrun,
even where Horovod is installed (imported there, its ``hvd.init()`` would make each worker a
world of one).
"""

from __future__ import annotations

import argparse
import os

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

if (
    "HOROVOD_RANK" in os.environ
):  # started by Horovod's launcher, or cloudtrain's `--runtime horovod`
    import horovod.torch as hvd  # type: ignore[import-not-found]
else:  # torchrun: the same API over torch.distributed
    import cloudtrain.runtime.hvd as hvd


def main() -> None:
    p = argparse.ArgumentParser(description="Train an MLP on digits, the Horovod way.")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.025, help="per worker (scaled by hvd.size())")
    args = p.parse_args()

    hvd.init()
    torch.manual_seed(hvd.rank())  # different on purpose: the broadcast below makes them equal

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)  # fmt: skip
    scaler = StandardScaler().fit(x_train)
    train = TensorDataset(torch.tensor(scaler.transform(x_train), dtype=torch.float32),
                          torch.tensor(y_train))  # fmt: skip
    sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank())
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(())
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(yb)
        mean_loss = hvd.allreduce(total / len(sampler), op=hvd.Average)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs} loss {mean_loss.item():.4f}", flush=True)

    with torch.no_grad():
        x_eval = torch.tensor(scaler.transform(x_test), dtype=torch.float32)
        right = (model(x_eval).argmax(1) == torch.tensor(y_test)).float().mean()
    accuracy = hvd.allreduce(right, op=hvd.Average)  # equal weights: equal on every rank
    if hvd.rank() == 0:
        print(f"final test accuracy: {accuracy.item():.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
