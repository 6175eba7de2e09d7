"""A data sharder that gives every rank the same amount of work."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler

from cloudtrain.runtime.dist import rank as _rank
from cloudtrain.runtime.dist import world_size as _world_size

__all__ = ["BalancedSampler"]


class BalancedSampler(Sampler[int]):
    """Shard ``range(n)`` over the ranks so that each gets exactly ``ceil(n / world)`` indices.

    Each epoch the order is a permutation seeded by ``seed + epoch`` (the same on every rank; call
    `set_epoch` before each epoch), padded by wrapping around that order until it divides
    evenly, then dealt out round-robin: rank r takes positions r, r + world, ... Nothing is
    dropped, every index lands on some rank at least once, and equal shard sizes mean no rank
    waits for a longer one at the gradient all-reduce. `rank` and `world_size` default to the
    job's (`cloudtrain.runtime.rank()` / `world_size()`, read once here).
    """

    def __init__(
        self,
        dataset_len_or_dataset: int | Sized,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
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
        self.n = n
        self.rank = me
        self.world_size = world
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.num_samples = math.ceil(n / world)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (the same on every rank)."""
        self.epoch = epoch

    def __len__(self) -> int:
        """The number of indices this rank yields per epoch: ``ceil(n / world)``."""
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        if self.n == 0:
            return iter([])
        if self.shuffle:
            gen = torch.Generator()
            gen.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=gen)
        else:
            order = torch.arange(self.n)
        total = self.num_samples * self.world_size
        if total > self.n:  # wrap around the order (more than once when world > n)
            order = order.repeat(math.ceil(total / self.n))[:total]
        mine: list[int] = order[self.rank : total : self.world_size].tolist()
        return iter(mine)
