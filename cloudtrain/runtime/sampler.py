"""A data sharder that gives every rank the same amount of work.

`BalancedSampler` deals one epoch's indices out to the ranks. Every rank gets the same number of
indices (``ceil(n / world)``: DDP needs the same number of steps everywhere), nothing is dropped,
and every rank computes the same deal on its own from ``(seed + epoch)``: no communication.

=====================================  ======================================================
``BalancedSampler(ds)``                equal counts: the shuffled order dealt round-robin
``BalancedSampler(ds, cost=lengths)``  equal counts and equal total cost over the epoch
``BalancedSampler(ds, cost=lengths,    equal counts and equal total cost in every step
batch_size=b)``                        (each rank's ``b`` samples of one global batch) and
                                       over the epoch
=====================================  ======================================================

Every mode starts from the same list: the permutation seeded by ``seed + epoch`` (``range(n)``
with ``shuffle=False``), wrapped around until ``world`` divides it (padding repeats the first
indices of the order, so which samples are seen twice changes every epoch, unbiased). With a
``cost`` the same list is cut into windows (the whole list, or ``world * batch_size`` positions
each with a ``batch_size``) and each window is cut into ``world`` bins by greedy LPT with a
capacity: largest cost first, to the bin with the least total so far among those holding fewer
than their share. Which rank takes which bin is free, and it is chosen for the epoch: window by
window, the widest spread (heaviest bin less lightest) first, the heaviest bin goes to the rank
with the least total so far (the lowest rank on a tie). So every step is balanced and so is the
epoch, at every batch size (a batch of 1 too, where every bin is one sample). A rank yields
what it got in the order's order, so its batches are as shuffled as without a cost.

Which mode: a synchronous step (DDP, FSDP) waits for its slowest rank, so the step time follows
the largest *batch*, not the largest shard. Over a long epoch, random shards already have near
equal totals (the law of large numbers); what differs is batch to batch. ``batch_size`` (the
same as the DataLoader's, so that a rank's share of window k is its batch k) balances each
step, and is what shortens a synchronous epoch; without it only the epoch totals are balanced
(the right thing when ranks do not step together). ``bench/sharding.py`` measures the three.

Cost of the deal: O(n log n) on every rank once per epoch (cached for the epoch), half a
second to a second and a half for n = 10**6 on one core (the most with a batch of 1); without a
cost, a permutation.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import TypeAlias

import torch
from torch.utils.data import Sampler

from cloudtrain.runtime.dist import rank as _rank
from cloudtrain.runtime.dist import world_size as _world_size

__all__ = ["BalancedSampler", "Cost"]

Cost: TypeAlias = Sequence[float] | torch.Tensor | Callable[[int], float]
"""Per-sample cost: a sequence or 1-D tensor (a numpy array works too), or ``f(index)``."""


class BalancedSampler(Sampler[int]):
    """Shard ``range(n)`` over the ranks so that each gets exactly ``ceil(n / world)`` indices.

    Each epoch the order is a permutation seeded by ``seed + epoch`` (the same on every rank; call
    `set_epoch` before each epoch), padded by wrapping around that order until it divides
    evenly. Without `cost` it is then dealt out round-robin: rank r takes positions r,
    r + world, ... With `cost` (one non-negative number per sample, e.g. its token count, or a
    function of the index called once per index here) the same padded order is shared out by
    greedy LPT so that every rank's total cost is about the same, over the whole epoch or, with
    `batch_size`, within every global batch of ``world * batch_size`` positions and over the
    epoch as well (see the module docstring). Nothing is dropped, every index lands on some
    rank at least once, and equal shard sizes mean no rank waits for a longer one at the
    gradient all-reduce. `rank` and `world_size` default to the job's
    (`cloudtrain.runtime.rank()` / `world_size()`, read once here).

    Raises TypeError for a dataset without a length or a cost that is not numbers, and
    ValueError for a bad length, rank, world size or batch size, a cost of the wrong length, or
    a negative, NaN or infinite cost.
    """

    def __init__(
        self,
        dataset_len_or_dataset: int | Sized,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        cost: Cost | None = None,
        batch_size: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(dataset_len_or_dataset, bool):
            raise TypeError("BalancedSampler needs a dataset length (int) or a sized dataset")
        if isinstance(dataset_len_or_dataset, int):
            n = dataset_len_or_dataset
        elif isinstance(dataset_len_or_dataset, Sized):
            n = len(dataset_len_or_dataset)
        else:
            raise TypeError(
                "BalancedSampler needs a dataset length (int) or a dataset with __len__, "
                f"got {type(dataset_len_or_dataset).__name__}"
            )
        world = _world_size() if world_size is None else world_size
        me = _rank() if rank is None else rank
        if n < 0:
            raise ValueError(f"dataset length must be >= 0, got {n}")
        if world < 1:
            raise ValueError(f"world_size must be >= 1, got {world}")
        if not 0 <= me < world:
            raise ValueError(f"rank must be in [0, {world}), got {me}")
        if batch_size is not None:
            if cost is None:
                raise ValueError("batch_size only applies with a cost: pass cost= as well")
            if isinstance(batch_size, bool) or batch_size < 1:
                raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.n = n
        self.rank = me
        self.world_size = world
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.num_samples = math.ceil(n / world)
        self.batch_size = batch_size
        self._cost = None if cost is None else _costs(cost, n)
        self._plan: tuple[tuple[int, int, bool], list[int], list[float]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (the same on every rank)."""
        self.epoch = epoch

    def __len__(self) -> int:
        """The number of indices this rank yields per epoch: ``ceil(n / world)``."""
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        if self.n == 0:
            return iter([])
        if self._cost is not None:
            return iter(self._deal(self._cost)[0])
        order = self._order()
        total = order.numel()
        mine: list[int] = order[self.rank : total : self.world_size].tolist()
        return iter(mine)

    def shard_costs(self) -> list[float]:
        """Every rank's total cost this epoch, padding included (index = rank).

        Without a cost every sample counts 1. The same list on every rank; computed once per
        epoch (with `__iter__`), so calling it costs nothing more. Idempotent, raises nothing.
        """
        if self._cost is None:
            return [float(self.num_samples if self.n else 0)] * self.world_size
        return list(self._deal(self._cost)[1])

    def _order(self) -> torch.Tensor:
        """This epoch's order, wrapped around (more than once when world > n) to world * len."""
        if self.shuffle:
            gen = torch.Generator()
            gen.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=gen)
        else:
            order = torch.arange(self.n)
        total = self.num_samples * self.world_size
        if total > self.n:
            order = order.repeat(math.ceil(total / self.n))[:total]
        return order

    def _deal(self, cost: torch.Tensor) -> tuple[list[int], list[float]]:
        """(this rank's indices in yield order, every rank's total cost), cached per epoch."""
        key = (self.epoch, self.seed, self.shuffle)
        if self._plan is not None and self._plan[0] == key:
            return self._plan[1], self._plan[2]
        world = self.world_size
        loads = [0.0] * world
        if self.n == 0:
            self._plan = (key, [], loads)
            return [], loads
        order = self._order()
        total = order.numel()
        window = world * min(self.batch_size or self.num_samples, self.num_samples)
        # Sort every window largest first at once (the last may be short); `at` maps a place
        # in `ranked` back to a position in `order`.
        costs = cost[order]
        full = total - total % window
        ranked_parts, at_parts = [], []
        if full:
            rows, at = torch.sort(
                costs[:full].view(-1, window), dim=1, descending=True, stable=True
            )
            ranked_parts.append(rows.flatten())
            at_parts.append((at + torch.arange(0, full, window).unsqueeze(1)).flatten())
        if full < total:
            rows, at = torch.sort(costs[full:], descending=True, stable=True)
            ranked_parts.append(rows)
            at_parts.append(at + full)
        ranked = torch.cat(ranked_parts).tolist()
        # Each window's bins are balanced; which rank takes which bin is free. Give them out
        # window by window, the widest spread first (while the rest can still even it out): the
        # heaviest bin to the rank with the least so far (the lowest rank on a tie), so every
        # step keeps its balanced bins and the epoch's totals come out even too, whatever
        # the batch size.
        bin_of: list[int] = []
        sums = [
            _lpt(ranked, s, min(s + window, total), world, bin_of) for s in range(0, total, window)
        ]
        spread = [max(s) - min(s) for s in sums]
        my_bin = [0] * len(sums)
        ranks = range(world)
        for w in sorted(range(len(sums)), key=spread.__getitem__, reverse=True):
            heaviest = sorted(ranks, key=sums[w].__getitem__, reverse=True)
            lightest = sorted(ranks, key=loads.__getitem__)
            for b, r in zip(heaviest, lightest, strict=True):
                loads[r] += sums[w][b]
                if r == self.rank:
                    my_bin[w] = b
        window_of = torch.arange(total) // window
        places = torch.tensor(bin_of) == torch.tensor(my_bin)[window_of]
        positions = torch.cat(at_parts)[places]
        mine: list[int] = order[torch.sort(positions).values].tolist()
        self._plan = (key, mine, loads)
        return mine, loads


def _lpt(ranked: list[float], start: int, stop: int, world: int, bin_of: list[int]) -> list[float]:
    """Greedy LPT with a capacity over ``ranked[start:stop]``, sorted largest first, into bins.

    ``stop - start`` is a multiple of `world`: each of the `world` bins takes that over `world`.
    Each cost goes to the bin with the least total so far among those with room left (the lowest
    bin on equal totals). Appends each place's bin to `bin_of`; returns every bin's total. A heap
    of (total, bin): O((stop - start) * log world).
    """
    if stop - start == world:  # one each (a batch of 1): bin b takes the b-th largest
        bin_of.extend(range(world))
        return ranked[start:stop]
    heap = [(0.0, b) for b in range(world)]  # sorted, so already a heap
    room = [(stop - start) // world] * world
    sums = [0.0] * world  # filled in as each bin fills up: all are full at the end
    put, replace, pop = bin_of.append, heapq.heapreplace, heapq.heappop
    for c in ranked[start:stop]:
        total, b = heap[0]
        put(b)
        room[b] -= 1
        if room[b]:
            replace(heap, (total + c, b))
        else:
            sums[b] = total + c
            pop(heap)
    return sums


def _costs(cost: Cost, n: int) -> torch.Tensor:
    """`cost` as a 1-D float64 tensor of n finite, non-negative numbers, or TypeError/ValueError."""
    if isinstance(cost, str | bytes):
        raise TypeError("cost must be a sequence of numbers or a function of the index, got str")
    if callable(cost):
        values: object = [cost(i) for i in range(n)]
        what = "cost(index) must return a number"
    else:
        values = cost
        what = "cost must be a sequence of numbers or a function of the index"
    try:
        out = torch.as_tensor(values, dtype=torch.float64, device="cpu").clone()
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"{what}: {err}") from None
    if out.dim() != 1:
        raise ValueError(f"cost must be one number per sample (1-D), got shape {list(out.shape)}")
    if out.numel() != n:
        raise ValueError(f"cost has {out.numel()} entries but the dataset has {n} samples")
    bad = ~torch.isfinite(out) | (out < 0)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"cost[{i}] is {out[i].item()}: costs must be finite and >= 0")
    return out
