"""BalancedSampler: equal shards, full coverage, no drop, deterministic per epoch."""

from __future__ import annotations

import math
from collections import Counter

import pytest

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
