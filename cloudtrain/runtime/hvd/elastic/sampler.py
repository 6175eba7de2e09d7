"""Horovod's `ElasticSampler` on cloudtrain's world: a sampler that splits a dataset over the
ranks and, after a reset, splits what is left of the epoch over the ranks there are then.

As Horovod's (0.28): the epoch's order is the dataset's indices, shuffled (``shuffle=True``)
by ``random.Random(seed + epoch)``, the same on every rank; ``record_batch(i, batch_size)``
counts ``batch_size × size()`` samples as done; a reset (`reset`, or `load_state_dict` from a
committed `TorchState`) drops the done part and deals the rest round robin, padded to a
multiple of the ranks. Call ``set_epoch`` at the end of an epoch (it clears what was done).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data

from cloudtrain.runtime.hvd.basics import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler[int]):
    """The indices of `dataset` for this rank, the part of the epoch not yet done."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`: nothing of it is done yet (call it once an epoch ends)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """A batch of `batch_size` was done on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict["processed_num"])
        self.reset()

    def reset(self) -> None:
        """Deal what is left of the epoch over the ranks there are now."""
        self.num_replicas, self.rank = size(), rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:  # even shares: wrap around
            padded += padded[: self.total_size - len(padded)]
        self.indices = padded[self.rank : self.total_size : self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
