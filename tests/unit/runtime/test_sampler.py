"""BalancedSampler: equal shards, full coverage, no drop, deterministic per epoch; with a cost,
equal work too (property tests over many random sizes, world sizes and skewed costs)."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from cloudtrain.runtime import BalancedSampler

SHAPES = [(1, 1), (10, 1), (10, 2), (10, 3), (7, 4), (3, 8), (1797, 2), (1437, 3), (100, 7)]


def shards(
    n: int, world: int, *, epoch: int = 0, shuffle: bool = True, seed: int = 0
) -> list[list[int]]:
    out = []
    for r in range(world):
        s = BalancedSampler(n, shuffle=shuffle, seed=seed, rank=r, world_size=world)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("n", "world"), SHAPES)
def test_equal_counts_cover_everything_and_pad_only_what_is_needed(
    n: int, world: int, shuffle: bool
) -> None:
    parts = shards(n, world, shuffle=shuffle, seed=3)
    per_rank = math.ceil(n / world)
    assert [len(p) for p in parts] == [per_rank] * world
    assert all(len(BalancedSampler(n, rank=r, world_size=world)) == per_rank for r in range(world))
    counts = Counter(i for p in parts for i in p)
    assert set(counts) == set(range(n))  # nothing dropped, nothing out of range
    # Padding wraps around the order: no index repeats more than the wrap requires.
    assert max(counts.values()) == math.ceil(per_rank * world / n)
    assert sum(counts.values()) == per_rank * world


def test_without_padding_the_shards_are_disjoint() -> None:
    parts = shards(12, 3, seed=1)
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(12))


def test_same_epoch_same_order_new_epoch_new_order() -> None:
    assert shards(100, 2, seed=5, epoch=4) == shards(100, 2, seed=5, epoch=4)
    assert shards(100, 2, seed=5, epoch=4) != shards(100, 2, seed=5, epoch=5)
    assert shards(100, 2, seed=5, epoch=4) != shards(100, 2, seed=6, epoch=4)


def test_iterating_twice_in_one_epoch_repeats_the_order() -> None:
    s = BalancedSampler(50, rank=1, world_size=2)
    s.set_epoch(2)
    assert list(s) == list(s)


def test_no_shuffle_deals_the_indices_round_robin() -> None:
    assert shards(5, 2, shuffle=False) == [[0, 2, 4], [1, 3, 0]]
    assert shards(5, 2, shuffle=False, epoch=9) == [[0, 2, 4], [1, 3, 0]]


def test_accepts_a_sized_dataset_and_reads_rank_and_world_from_the_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    s = BalancedSampler(list("abcdefg"), shuffle=False)
    assert (s.rank, s.world_size, len(s)) == (1, 3, 3)
    assert list(s) == [1, 4, 0]


def test_empty_dataset_yields_nothing() -> None:
    s = BalancedSampler(0, rank=0, world_size=2)
    assert len(s) == 0
    assert list(s) == []


@pytest.mark.parametrize(
    ("n", "rank", "world", "message"),
    [
        (-1, 0, 1, "length must be >= 0"),
        (4, 0, 0, "world_size must be >= 1"),
        (4, 2, 2, r"rank must be in \[0, 2\)"),
        (4, -1, 2, r"rank must be in \[0, 2\)"),
    ],
)
def test_bad_arguments_are_refused(n: int, rank: int, world: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BalancedSampler(n, rank=rank, world_size=world)


def test_an_unsized_dataset_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="__len__"):
        BalancedSampler(iter(range(3)))  # type: ignore[arg-type]


# --- cost-balanced sharding --------------------------------------------------------------------


def cost_shards(
    n: int,
    world: int,
    cost: Sequence[float],
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    batch_size: int | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Every rank's indices, and every rank's `shard_costs()`, each from a sampler of its own."""
    parts, totals = [], []
    for r in range(world):
        s = BalancedSampler(
            n,
            shuffle=shuffle,
            seed=seed,
            rank=r,
            world_size=world,
            cost=cost,
            batch_size=batch_size,
        )
        s.set_epoch(epoch)
        parts.append(list(s))
        totals.append(s.shard_costs())
    return parts, totals


def lognormal(rng: random.Random, n: int, sigma: float = 1.0) -> list[float]:
    """Token lengths of a typical text corpus: most short, a long tail."""
    return [float(max(1, round(rng.lognormvariate(5, sigma)))) for _ in range(n)]


def zipf(rng: random.Random, n: int) -> list[float]:
    """A heavier tail: a few samples cost as much as a whole shard."""
    return [float(min(int(rng.paretovariate(1.1) * 16), 100_000)) for _ in range(n)]


def load(part: list[int], cost: Sequence[float]) -> float:
    return sum(cost[i] for i in part)


def test_cost_deals_largest_first_to_the_lightest_rank_with_room() -> None:
    # Sorted: 5→r0, 4→r1, 3→r1 (4 < 5), 3→r0 (5 < 7), 2→r1 (7 < 8, r1 now full), 1→r0.
    parts, totals = cost_shards(6, 2, [5, 4, 3, 3, 2, 1], shuffle=False)
    assert parts == [[0, 3, 5], [1, 2, 4]]
    assert totals == [[9.0, 9.0], [9.0, 9.0]]


def test_equal_totals_break_ties_by_the_lowest_rank() -> None:
    parts, totals = cost_shards(6, 3, [1.0] * 6, shuffle=False)
    assert parts == [[0, 3], [1, 4], [2, 5]]
    assert totals[0] == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("case", range(40))
def test_cost_shards_cover_everything_equally_and_agree_on_every_rank(case: int) -> None:
    rng = random.Random(case)
    n = rng.choice([rng.randint(1, 12), rng.randint(13, 400)])
    world = rng.randint(1, 9)
    cost = rng.choice([lognormal, zipf])(rng, n)
    batch_size = rng.choice([None, rng.randint(1, 8)])
    epoch, seed = rng.randint(0, 5), rng.randint(0, 1000)
    parts, totals = cost_shards(n, world, cost, epoch=epoch, seed=seed, batch_size=batch_size)
    per_rank = math.ceil(n / world)
    assert [len(p) for p in parts] == [per_rank] * world
    counts = Counter(i for p in parts for i in p)
    assert set(counts) == set(range(n))
    # The same padded multiset as the count-balanced deal: only who gets what differs.
    assert counts == Counter(i for p in shards(n, world, epoch=epoch, seed=seed) for i in p)
    # Every rank computed the same totals on its own, and they are what each rank yields.
    assert all(t == totals[0] for t in totals)
    assert totals[0] == pytest.approx([load(p, cost) for p in parts])
    # The same again: a second sampler, and a second pass over the same one.
    assert cost_shards(n, world, cost, epoch=epoch, seed=seed, batch_size=batch_size)[0] == parts


@pytest.mark.parametrize("case", range(20))
def test_a_rank_yields_its_share_in_the_epochs_shuffled_order(case: int) -> None:
    rng = random.Random(1000 + case)
    world = rng.randint(2, 8)
    n = world * rng.randint(20, 60)  # no padding: every index has one position in the order
    cost = lognormal(rng, n)
    seed, epoch = rng.randint(0, 99), rng.randint(0, 9)
    order = [i for p in zip(*shards(n, world, seed=seed, epoch=epoch), strict=True) for i in p]
    where = {i: pos for pos, i in enumerate(order)}
    for part in cost_shards(n, world, cost, seed=seed, epoch=epoch)[0]:
        positions = [where[i] for i in part]
        assert positions == sorted(positions)
        assert [cost[i] for i in part] != sorted((cost[i] for i in part), reverse=True)
    for part in cost_shards(n, world, cost, shuffle=False, epoch=epoch)[0]:
        assert part == sorted(part)


def test_cost_epochs_and_seeds_change_the_order_but_not_the_length() -> None:
    cost = lognormal(random.Random(7), 500)
    base = cost_shards(500, 4, cost, epoch=1)[0]
    assert cost_shards(500, 4, cost, epoch=1)[0] == base
    assert cost_shards(500, 4, cost, epoch=2)[0] != base
    assert cost_shards(500, 4, cost, epoch=1, seed=1)[0] != base
    s = BalancedSampler(500, rank=2, world_size=4, cost=cost)
    s.set_epoch(3)
    first = list(s)
    assert list(s) == first
    s.set_epoch(4)
    assert list(s) != first
    assert len(s) == len(first) == 125


@pytest.mark.parametrize("case", range(30))
def test_cost_balance_is_near_perfect_and_beats_count_balance(case: int) -> None:
    rng = random.Random(2000 + case)
    n, world, seed = rng.randint(1000, 4000), rng.randint(2, 16), rng.randint(0, 99)
    per_rank = math.ceil(n / world)
    by_count = shards(n, world, seed=seed)

    cost = lognormal(rng, n, sigma=rng.choice([0.5, 1.0, 1.5]))
    totals = BalancedSampler(n, seed=seed, rank=0, world_size=world, cost=cost).shard_costs()
    mean = sum(totals) / world
    assert max(totals) / mean <= 1.05
    assert max(totals) < max(load(p, cost) for p in by_count)

    # Zipf: one sample can outweigh a whole shard, so bound against what any equal-count deal
    # must reach: the largest sample plus the smallest others that fill its rank, or the mean.
    cost = zipf(rng, n)
    totals = BalancedSampler(n, seed=seed, rank=0, world_size=world, cost=cost).shard_costs()
    ranked = sorted(cost)
    floor = max(sum(totals) / world, ranked[-1] + sum(ranked[: per_rank - 1]))
    assert max(totals) / floor <= 1.10
    assert max(totals) < max(load(p, cost) for p in by_count)


@pytest.mark.parametrize("case", range(15))
def test_batch_size_balances_every_global_batch(case: int) -> None:
    rng = random.Random(3000 + case)
    world, batch = rng.randint(2, 8), rng.randint(8, 32)
    n = rng.randint(50, 120) * world * batch // 10
    cost, seed = lognormal(rng, n), rng.randint(0, 99)
    per_rank = math.ceil(n / world)
    order = [i for p in zip(*shards(n, world, seed=seed), strict=True) for i in p]
    parts = cost_shards(n, world, cost, seed=seed, batch_size=batch)[0]
    epoch_parts = cost_shards(n, world, cost, seed=seed)[0]
    steps = range(0, per_rank, batch)
    mean_ratio = {"step": 0.0, "epoch": 0.0}  # max / mean of a step's rank loads, averaged
    for k in steps:
        # Batch k of every rank is global batch k of the order, shared out.
        window = order[k * world : (k + batch) * world]
        assert Counter(i for p in parts for i in p[k : k + batch]) == Counter(window)
        for name, deal in (("step", parts), ("epoch", epoch_parts)):
            loads = [load(p[k : k + batch], cost) for p in deal]
            mean_ratio[name] += max(loads) / (sum(loads) / world) / len(steps)
    assert mean_ratio["step"] < mean_ratio["epoch"]
    assert mean_ratio["step"] <= 1.25


@pytest.mark.parametrize("batch", [1, 4, 64])
def test_batch_size_keeps_the_epoch_totals_even_too(batch: int) -> None:
    # The bench's corpus (lognormal around 128 tokens, sigma 1) over 4 ranks. Each window's
    # heaviest share once went to rank 0 every step: at a batch of 1 the totals were 2.18x the
    # mean (rank 0 took the largest sample of every step), count-balanced 1.03x.
    rng = random.Random(11)
    n, world = 1797, 4
    cost = [min(4096.0, max(8.0, round(rng.lognormvariate(math.log(128), 1.0)))) for _ in range(n)]
    parts, totals = cost_shards(n, world, cost, seed=2, batch_size=batch)
    mean = sum(totals[0]) / world
    assert max(totals[0]) / mean <= 1.01
    assert totals[0] == pytest.approx([load(p, cost) for p in parts])
    by_count = [load(p, cost) for p in shards(n, world, seed=2)]
    assert max(totals[0]) < max(by_count)
    # Each step is still global batch k of the order, shared out: only who takes which share
    # changed.
    order = [i for p in zip(*shards(n, world, seed=2), strict=True) for i in p]
    for k in range(0, len(parts[0]), batch):
        window = order[k * world : (k + batch) * world]
        assert Counter(i for p in parts for i in p[k : k + batch]) == Counter(window)


@pytest.mark.parametrize("case", range(20))
@pytest.mark.parametrize("batch", [1, 4, 64])
def test_epoch_totals_are_even_at_every_batch_size(batch: int, case: int) -> None:
    rng = random.Random(5000 + case)
    world, seed = rng.randint(2, 16), rng.randint(0, 99)
    n = world * batch * rng.randint(8, 40) + rng.randint(0, world * batch)  # 8+ steps, a tail
    cost = lognormal(rng, n, sigma=rng.choice([0.5, 1.0]))
    parts, totals = cost_shards(n, world, cost, seed=seed, batch_size=batch)
    worst = max(totals[0])
    assert worst < max(load(p, cost) for p in shards(n, world, seed=seed))
    # Within 5% of the mean, or where no deal of these same steps can do better: a long sample
    # makes its step's heaviest share heavy, and the rank that takes it gets at least the
    # lightest share of every other step.
    steps = [[load(p[k : k + batch], cost) for p in parts] for k in range(0, len(parts[0]), batch)]
    lightest = [min(step) for step in steps]
    floor = max(max(s) - low for s, low in zip(steps, lightest, strict=True)) + sum(lightest)
    assert worst <= max(1.05 * sum(totals[0]) / world, floor * (1 + 1e-9))


def test_a_function_of_the_index_is_the_same_as_the_list_of_its_values() -> None:
    cost = lognormal(random.Random(3), 300)
    s = BalancedSampler(300, rank=1, world_size=3, cost=cost.__getitem__)
    assert list(s) == cost_shards(300, 3, cost)[0][1]
    tensor = BalancedSampler(300, rank=1, world_size=3, cost=torch.tensor(cost))
    assert list(tensor) == list(s)


def test_more_ranks_than_samples_with_a_cost() -> None:
    # The order wraps to 0 1 2 0 1 2 0 1; one each, largest first, to ranks 0, 1, 2, ...
    parts, totals = cost_shards(3, 8, [3.0, 1.0, 2.0], shuffle=False)
    assert parts == [[0], [0], [0], [2], [2], [1], [1], [1]]
    assert totals[0] == [3.0, 3.0, 3.0, 2.0, 2.0, 1.0, 1.0, 1.0]


def test_shard_costs_without_a_cost_counts_samples() -> None:
    assert BalancedSampler(10, rank=0, world_size=3).shard_costs() == [4.0, 4.0, 4.0]
    assert BalancedSampler(0, rank=0, world_size=2).shard_costs() == [0.0, 0.0]
    empty = BalancedSampler(0, rank=1, world_size=2, cost=[])
    assert (list(empty), empty.shard_costs()) == ([], [0.0, 0.0])


@pytest.mark.parametrize(
    ("cost", "batch_size", "error", "message"),
    [
        ([1.0, 2.0], None, ValueError, "cost has 2 entries but the dataset has 4 samples"),
        ([1.0, 2.0, -3.0, 4.0], None, ValueError, r"cost\[2\] is -3.0: .*finite and >= 0"),
        ([1.0, math.nan, 3.0, 4.0], None, ValueError, r"cost\[1\] is nan"),
        ([1.0, 2.0, 3.0, math.inf], None, ValueError, r"cost\[3\] is inf"),
        ([[1.0, 2.0], [3.0, 4.0]], None, ValueError, r"1-D\), got shape \[2, 2\]"),
        ([1.0, None, 3.0, 4.0], None, TypeError, "sequence of numbers"),
        ("abcd", None, TypeError, "got str"),
        (lambda i: -1.0 if i == 3 else 1.0, None, ValueError, r"cost\[3\] is -1.0"),
        (lambda i: "long", None, TypeError, r"cost\(index\) must return a number"),
        ([1.0] * 4, 0, ValueError, "batch_size must be >= 1, got 0"),
        (None, 2, ValueError, "batch_size only applies with a cost"),
    ],
)
def test_bad_costs_are_refused(
    cost: object, batch_size: int | None, error: type[Exception], message: str
) -> None:
    bad: Any = cost
    with pytest.raises(error, match=message):
        BalancedSampler(4, rank=0, world_size=2, cost=bad, batch_size=batch_size)
