"""Does cost-balanced sharding shorten a synchronous epoch? Three deals of one corpus, measured.

    python bench/sharding.py [--samples 8192] [--world 4] [--batch-size 16] [--repeats 3]

A synthetic corpus of lognormal token lengths (median 128 tokens, a long tail, capped at 4096) is
sharded over `--world` ranks by `BalancedSampler` three ways, in the same run:

  (a) count:      equal counts, the shuffled order dealt round-robin (the default);
  (b) cost/epoch: ``cost=lengths``: equal counts and equal total tokens over the epoch;
  (c) cost/step:  ``cost=lengths, batch_size=B``: equal counts and equal tokens in every step.

Step k of a rank is its k-th batch of B samples, packed (no padding) into as many tokens as their
lengths add up to, and its work is real: a d x d linear layer and a GELU over those tokens,
forward and backward, timed (best of `--repeats`) for every rank one after another in this
process on one thread (a rank each, as on equal GPUs). The deals take turns step by step, so a
slow spell of the machine hits all three alike. It prints, per deal, the per-step imbalance
(max / mean over ranks of a step's time, averaged over steps), the synchronous epoch (the sum
over steps of the slowest rank's time: what DDP's all-reduce waits for), the ideal (the sum of
the means), the slowest rank's own total, the same by token counts (exact, no timing noise),
and each cost deal's ratio to count (< 1.0: shorter). Last, the time one rank takes to compute
its deal for a large corpus.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cloudtrain.runtime import BalancedSampler  # noqa: E402

DEALS = ("count", "cost/epoch", "cost/step")


def corpus(n: int, seed: int) -> torch.Tensor:
    """Token lengths: lognormal around 128 (sigma 1), at least 8, at most 4096."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.empty(n, dtype=torch.float64).log_normal_(math.log(128), 1.0, generator=gen)
    return lengths.round().clamp(8, 4096).to(torch.int64)


def sampler(
    deal: str, n: int, rank: int, world: int, lengths: torch.Tensor, batch: int
) -> BalancedSampler:
    if deal == "count":
        return BalancedSampler(n, rank=rank, world_size=world)
    return BalancedSampler(
        n,
        rank=rank,
        world_size=world,
        cost=lengths,
        batch_size=batch if deal == "cost/step" else None,
    )


def step_tokens(deal: str, lengths: torch.Tensor, world: int, batch: int) -> list[list[int]]:
    """tokens[k][r]: how many tokens rank r packs into its step k (full batches only)."""
    n = lengths.numel()
    per_rank = []
    for r in range(world):
        idx = torch.tensor(list(sampler(deal, n, r, world, lengths, batch)), dtype=torch.long)
        steps = idx.numel() // batch
        per_rank.append(lengths[idx[: steps * batch]].view(steps, batch).sum(1).tolist())
    return [list(step) for step in zip(*per_rank, strict=True)]


@dataclass
class Model:
    """The work of one step: a linear layer and a GELU over the step's packed tokens."""

    dim: int
    max_tokens: int

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(self.max_tokens, self.dim, generator=gen)
        self.w = torch.randn(self.dim, self.dim, generator=gen).requires_grad_()

    def seconds(self, tokens: int, repeats: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.autograd.backward(torch.nn.functional.gelu(self.x[:tokens] @ self.w).sum())
            best = min(best, time.perf_counter() - start)
        self.w.grad = None
        return best


@dataclass
class Figures:
    step_imbalance: float  # mean over steps of max / mean over ranks
    sync_epoch: float  # sum over steps of the slowest rank
    ideal_epoch: float  # sum over steps of the mean rank
    slowest_rank: float  # the largest of the ranks' own totals


def figures(per_step: list[list[float]]) -> Figures:
    return Figures(
        step_imbalance=statistics.fmean(max(s) / statistics.fmean(s) for s in per_step),
        sync_epoch=sum(max(s) for s in per_step),
        ideal_epoch=sum(statistics.fmean(s) for s in per_step),
        slowest_rank=max(sum(col) for col in zip(*per_step, strict=True)),
    )


def deal_seconds(deal: str, n: int, world: int, batch: int) -> float:
    lengths = corpus(n, seed=1)
    start = time.perf_counter()
    list(sampler(deal, n, world - 1, world, lengths, batch))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128, help="width of the timed layer")
    parser.add_argument(
        "--repeats", type=int, default=3, help="time each step this often, keep the best"
    )
    parser.add_argument(
        "--deal-samples", type=int, default=1_000_000, help="corpus size for the deal timing"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4096 samples, one repeat (CI)")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.repeats, args.deal_samples = 4096, 1, 100_000
    torch.set_num_threads(1)
    n, world, batch = args.samples, args.world, args.batch_size

    lengths = corpus(n, args.seed)
    tokens = {deal: step_tokens(deal, lengths, world, batch) for deal in DEALS}
    steps = len(tokens["count"])
    model = Model(args.dim, max(t for per in tokens.values() for s in per for t in s))
    model.seconds(model.max_tokens, 3)  # warm up
    times: dict[str, list[list[float]]] = {deal: [] for deal in DEALS}
    for k in range(steps):
        for j in range(len(DEALS)):
            deal = DEALS[(k + j) % len(DEALS)]
            times[deal].append([model.seconds(t, args.repeats) for t in tokens[deal][k]])

    by_tokens = {deal: figures([[float(t) for t in s] for s in tokens[deal]]) for deal in DEALS}
    by_time = {deal: figures(times[deal]) for deal in DEALS}
    print(
        f"{n} samples, lognormal lengths (median {lengths.median().item()}, mean "
        f"{lengths.double().mean().item():.0f}, max {lengths.max().item()} tokens), "
        f"{world} ranks x batch {batch}, {steps} steps, layer {args.dim}x{args.dim}, "
        f"best of {args.repeats}:"
    )
    head = "".join(f"{d:>11}" for d in DEALS)
    print(f"{'':36}{head}{'epoch/count':>12}{'step/count':>11}")
    rows = [
        ("per-step max/mean, tokens", by_tokens, "step_imbalance", 1.0),
        ("per-step max/mean, time", by_time, "step_imbalance", 1.0),
        ("synchronous epoch, Mtokens", by_tokens, "sync_epoch", 1e-6),
        ("synchronous epoch (s)", by_time, "sync_epoch", 1.0),
        ("ideal epoch (s), sum of means", by_time, "ideal_epoch", 1.0),
        ("slowest rank's own total (s)", by_time, "slowest_rank", 1.0),
    ]
    for label, table, field, scale in rows:
        values = [getattr(table[d], field) * scale for d in DEALS]
        cells = "".join(f"{v:11.3f}" for v in values)
        print(f"{label:>36}{cells}{values[1] / values[0]:12.3f}{values[2] / values[0]:11.3f}")

    big = args.deal_samples
    spent = {deal: deal_seconds(deal, big, world, batch) for deal in DEALS}
    print(
        f"\none rank's deal of {big:,} samples over {world} ranks (s): "
        + ", ".join(f"{d} {s:.2f}" for d, s in spent.items())
    )


if __name__ == "__main__":
    main()
