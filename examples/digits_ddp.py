"""Train a small MLP on scikit-learn's digits (offline, 1797 8x8 images) with data parallelism.

    torchrun --standalone --nproc-per-node 2 examples/digits_ddp.py --epochs 5
    python examples/digits_ddp.py                 # one process works too
    cloudtrain launch examples/digits.yaml        # on a cluster

Every epoch is checkpointed; run it again with more --epochs and it resumes.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cloudtrain import runtime


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train an MLP on digits, data-parallel.")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per replica")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", type=Path, default=runtime.checkpoint_dir())
    p.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds to wait after each epoch (time for a demo, a test or a benchmark to break "
        "a node mid-job)",
    )
    return p.parse_args()


def load_data() -> tuple[TensorDataset, TensorDataset]:
    """Standardised features; the same 80/20 split on every rank and every run."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    scaler = StandardScaler().fit(x_train)
    train = TensorDataset(
        torch.tensor(scaler.transform(x_train), dtype=torch.float32), torch.tensor(y_train)
    )
    test = TensorDataset(
        torch.tensor(scaler.transform(x_test), dtype=torch.float32), torch.tensor(y_test)
    )
    return train, test


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset) -> float:
    x, y = data.tensors
    model.eval()
    correct = (model(x.to(runtime.device())).argmax(1).cpu() == y).float().mean()
    model.train()
    return float(correct)


def main() -> None:
    args = parse_args()
    runtime.init()
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    train, test = load_data()

    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    path = args.checkpoint_dir / "digits.pt"
    ckpt = runtime.load_checkpoint(path)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    ddp = runtime.wrap(model, "ddp")
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        start = ckpt["epoch"]
        if runtime.is_main():
            print(f"resumed from epoch {start}", flush=True)

    sampler = runtime.BalancedSampler(train, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    node = os.environ.get("CLOUDTRAIN_NODE_RANK", "0")
    share = f"{len(sampler)} of {len(train)} training samples per epoch"
    # One write (end=""): every rank prints this line at once, and a separate "\n" write
    # could land between another rank's words.
    print(f"rank {runtime.rank()}/{runtime.world_size()} on node {node}: {share}\n", end="",
          flush=True)  # fmt: skip
    first_step = True
    runtime.report(total_steps=args.epochs * len(loader))  # `train` shows an ETA from it
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        total_loss, correct, seen = 0.0, 0, 0
        epoch_started = time.monotonic()
        for x, y in loader:
            x, y = x.to(runtime.device()), y.to(runtime.device())
            optimizer.zero_grad()
            out = ddp(x)
            loss = loss_fn(out, y)
            loss.backward()
            optimizer.step()
            runtime.step()  # the job's progress: a recovery counts the steps it redid
            if first_step and runtime.is_main():
                print("cloudtrain: first step", flush=True)
            first_step = False
            total_loss += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
        # Each rank saw its own shard: average the metrics over the replicas.
        train_loss = runtime.average(total_loss / seen)
        train_acc = runtime.average(correct / seen)
        test_acc = accuracy(model, test)  # the whole test set; replicas hold the same weights
        samples_s = seen * runtime.world_size() / (time.monotonic() - epoch_started)
        runtime.report(epoch=epoch + 1, loss=train_loss, train_acc=train_acc,
                       test_acc=test_acc, samples_s=samples_s)  # fmt: skip
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        runtime.save_checkpoint(path, {**state, "epoch": epoch + 1})
        if runtime.is_main():
            print(
                f"epoch {epoch + 1}/{args.epochs} loss {train_loss:.4f} "
                f"train_acc {train_acc:.4f} test_acc {test_acc:.4f}",
                flush=True,
            )
        time.sleep(args.pause)

    final = accuracy(model, test)
    if runtime.is_main():
        print(f"final test accuracy: {final:.4f}", flush=True)
    del ddp  # its reducer talks to the group: let it go before the group does
    runtime.shutdown()


if __name__ == "__main__":
    main()
