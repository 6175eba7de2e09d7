"""Model scaling on CPU: a wide MLP that one rank's memory budget cannot hold, sharded over ranks.

    torchrun --standalone --nproc-per-node 2 examples/digits_fsdp.py --strategy fsdp
    CLOUDTRAIN_STRATEGY=fsdp torchrun --standalone --nproc-per-node 2 examples/digits_fsdp.py
    cloudtrain train --strategy fsdp ... examples/digits_fsdp.py     # on a cluster

Each rank may hold --budget-mb of training state: parameters, gradients and Adam's two moments,
counted from the tensors the rank actually holds once the model is wrapped. The 64-2048-2048-10
MLP (4.35 M parameters, 17.4 MB) needs 69.6 MB of that on every rank under DDP, which replicates
it, and half of it on each of 2 ranks under FSDP, which shards it: with the default budget of
48 MB, DDP stops at the start (exit code 2) and FSDP trains. Every epoch is saved sharded
(`runtime.save_sharded`: each rank writes its own shard) to $CLOUDTRAIN_CHECKPOINT_DIR/digits_fsdp;
run it again with more --epochs, on any number of ranks, and it resumes.

At the end each rank prints the most it held, and its peak RSS: that one counts what the budget
does not (torch itself, the data, FSDP's gathered layer and full-size gradients of one layer at
a time, and freed memory glibc's allocator keeps for reuse). On two ranks fsdp's peak is below
ddp's, 473 against 551 MiB (`python bench/fsdp_memory.py`: `runtime.wrap` keeps glibc from
holding on to each freed gather, which made it 678 MiB).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

from cloudtrain import runtime

MB = 1e6


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a wide MLP on digits, sharded (FSDP2).")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per replica")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--strategy",
        choices=runtime.STRATEGIES,
        default=None,
        help="ddp or fsdp (default: the job's, $CLOUDTRAIN_STRATEGY, else ddp)",
    )
    p.add_argument(
        "--budget-mb",
        type=float,
        default=48.0,
        help="training state one rank may hold: params + grads + Adam state (default: %(default)s)",
    )
    p.add_argument("--checkpoint-dir", type=Path, default=runtime.checkpoint_dir())
    p.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds to wait after each epoch (time for a test to break a node mid-job)",
    )
    return p.parse_args()


def load_data() -> tuple[TensorDataset, TensorDataset]:
    """Standardised features; the same 80/20 split on every rank and every run (as digits_ddp)."""
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


def shard(model: nn.Sequential, strategy: str) -> nn.Module:
    """`model` wrapped for `strategy`; under FSDP each Linear is its own unit, so a forward
    gathers one layer's full weights at a time, never the whole model's."""
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(runtime.device().type, (runtime.world_size(),))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
    return runtime.wrap(model, strategy)  # the root: FSDP in place, or DDP around it


def local_bytes(t: torch.Tensor) -> int:
    """What this rank stores of `t`: its shard for a DTensor (FSDP), all of it otherwise."""
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def held(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[int, int, int]:
    """Bytes this rank holds now: (parameters, gradients, optimizer state)."""
    params = list(model.parameters())
    grads = sum(local_bytes(p.grad) for p in params if p.grad is not None)
    state = 0
    if optimizer is not None:
        for per_param in optimizer.state.values():
            state += sum(local_bytes(v) for v in per_param.values() if isinstance(v, torch.Tensor))
    return sum(local_bytes(p) for p in params), grads, state


def max_rss_mib() -> float:
    """This process's peak resident memory so far (what the OS saw: transient buffers, and
    freed memory the allocator kept, included)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset) -> float:
    """On every rank (FSDP gathers each layer's weights for the forward: collective)."""
    x, y = data.tensors
    model.eval()
    correct = (model(x.to(runtime.device())).argmax(1).cpu() == y).float().mean()
    model.train()
    return float(correct)


def main() -> None:
    args = parse_args()
    strategy = args.strategy or runtime.strategy()
    runtime.init()
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    train, test = load_data()
    world = runtime.world_size()

    rss_before = max_rss_mib()  # the interpreter, torch and the data: before any model
    h = args.hidden
    # Built whole on every rank, then sharded: the parameters alone (17.4 MB) fit a rank; their
    # training state does not. (A model whose parameters alone do not fit is built on the meta
    # device and materialised shard by shard: `to_empty` after `fully_shard`.)
    mlp = nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    model = shard(mlp, strategy)

    # What a rank will hold once training runs: its parameters, as many gradient bytes, and
    # Adam's two moments of each.
    params, _, _ = held(model, None)
    need = 4 * params
    if need > args.budget_mb * MB:
        where = "ddp" if strategy == "ddp" else f"fsdp over {world} rank{'s' * (world > 1)}"
        advice = "use --strategy fsdp" if strategy == "ddp" else "use more ranks"
        if runtime.is_main():
            print(
                f"model needs {need / MB:.1f} MB per rank under {where} (params "
                f"{params / MB:.1f} + grads {params / MB:.1f} + adam {2 * params / MB:.1f}) > "
                f"budget {args.budget_mb:g} MB: {advice}",
                file=sys.stderr,
                flush=True,
            )
        del model
        runtime.shutdown()
        sys.exit(2)

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    folder = args.checkpoint_dir / "digits_fsdp"
    start = 0
    extra = runtime.load_sharded(folder, model, optimizer)
    if extra is not None:
        start = int(extra["epoch"])
        if runtime.is_main():
            saved_by = f"{extra['world_size']} rank{'s' * (extra['world_size'] > 1)}"
            print(f"resumed from epoch {start} (saved by {saved_by}, now {world})", flush=True)

    sampler = runtime.BalancedSampler(train, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    node = os.environ.get("CLOUDTRAIN_NODE_RANK", "0")
    share = f"{len(sampler)} of {len(train)} training samples per epoch"
    # One write (end=""): every rank prints at once, and a separate "\n" could land between
    # another rank's words.
    line = f"rank {runtime.rank()}/{world} on node {node}: {share} ({strategy})\n"
    print(line, end="", flush=True)
    peak = (0, 0, 0)
    started = time.monotonic()
    first_step = True
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        total_loss, correct, seen = 0.0, 0, 0
        for x, y in loader:
            x, y = x.to(runtime.device()), y.to(runtime.device())
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            now = held(model, optimizer)  # the most a step holds: grads and Adam state both
            peak = max(peak, now, key=sum)
            optimizer.step()
            runtime.step()
            if first_step and runtime.is_main():
                print("cloudtrain: first step", flush=True)
            first_step = False
            total_loss += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
        train_loss = runtime.average(total_loss / seen)
        train_acc = runtime.average(correct / seen)
        test_acc = accuracy(model, test)
        runtime.save_sharded(
            folder, model, optimizer, extra={"epoch": epoch + 1, "world_size": world}
        )
        if runtime.is_main():
            print(
                f"epoch {epoch + 1}/{args.epochs} loss {train_loss:.4f} "
                f"train_acc {train_acc:.4f} test_acc {test_acc:.4f}",
                flush=True,
            )
        time.sleep(args.pause)

    final = accuracy(model, test)
    seconds = time.monotonic() - started
    rss = max_rss_mib()
    p, g, s = peak
    fits = "within" if sum(peak) <= args.budget_mb * MB else "OVER"
    figures = (
        f"rank {runtime.rank()}/{world}: held at most {sum(peak) / MB:.1f} MB (params "
        f"{p / MB:.1f} + grads {g / MB:.1f} + adam {s / MB:.1f}), {fits} budget "
        f"{args.budget_mb:g} MB; max RSS {rss:.0f} MiB ({rss - rss_before:+.0f} over the "
        f"{rss_before:.0f} before the model); {seconds:.1f} s training\n"
    )
    print(figures, end="", flush=True)
    runtime.barrier()  # the ranks' lines first, then the last one
    if runtime.is_main():
        print(f"final test accuracy: {final:.4f}", flush=True)
    del model
    runtime.shutdown()


if __name__ == "__main__":
    main()
