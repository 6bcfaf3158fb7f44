"""Data loaders whose order is a function of (seed, epoch), so a resumed run sees the same data.

    loader = make_loader(dataset, batch_size=32, shuffle=True, seed=0)

The trainer calls ``loader.batch_sampler.set_epoch(epoch)`` and, when resuming mid-epoch,
``skip_batches(k)``: the skipped batches are never loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

# Mixes seed and epoch into one generator seed; any odd multiplier larger than the epoch
# count keeps (seed, epoch) pairs apart.
_EPOCH_MIX = 1_000_003


class EpochBatchSampler(Sampler[list[int]]):
    """Yields index batches in an order fixed by (seed, epoch), resumable at any batch."""

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_samples < 1:
            raise ValueError("the dataset is empty; a loader needs at least one sample")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._skip = 0
        # The DataLoader's generator seeds worker processes; re-seeding it per epoch makes
        # worker-side randomness a function of (seed, epoch) too, and keeps the loader from
        # drawing on the global torch RNG (which would break exact resume).
        self._loader_generator = generator

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self._loader_generator is not None:
            self._loader_generator.manual_seed(self._mixed_seed() + 1)

    def skip_batches(self, count: int) -> None:
        """Start the next iteration ``count`` batches into the epoch (consumed once)."""
        if count < 0:
            raise ValueError(f"cannot skip a negative number of batches ({count})")
        self._skip = count

    def order(self) -> list[int]:
        """The sample order of the current epoch."""
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator().manual_seed(self._mixed_seed())
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "num_samples": self.num_samples,
                "batch_size": self.batch_size, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["num_samples"]) != self.num_samples:
            raise ValueError(
                f"the checkpoint was taken on a dataset of {state['num_samples']} samples, "
                f"this loader has {self.num_samples}; resume with the same dataset"
            )
        self.seed = int(state["seed"])
        self.set_epoch(int(state["epoch"]))

    def _mixed_seed(self) -> int:
        return (self.seed * _EPOCH_MIX + self.epoch) % (2**63 - 1)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order()
        start, self._skip = self._skip * self.batch_size, 0
        stop = len(self) * self.batch_size if self.drop_last else self.num_samples
        for begin in range(start, stop, self.batch_size):
            yield order[begin : min(begin + self.batch_size, stop)]

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)


def make_loader(
    dataset: Dataset[Any],
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    *,
    drop_last: bool = False,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    pin_memory: bool = False,
    **loader_kwargs: Any,
) -> DataLoader[Any]:
    """A DataLoader whose per-epoch order depends only on (seed, epoch), and that can resume.

    Args:
        dataset: a map-style dataset (``len`` and integer indexing).
        batch_size: the micro-batch size m.
        shuffle: shuffle per epoch (deterministically); False keeps dataset order.
        seed: the order seed; the same seed gives the same order on any machine.
        drop_last: drop the last short batch (the trainer handles short batches exactly, so
            the default keeps it).
    """
    if not isinstance(dataset, Sized):
        raise TypeError("make_loader needs a map-style dataset with __len__ (not an IterableDataset)")
    generator = torch.Generator()
    batch_sampler = EpochBatchSampler(
        len(dataset), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
        generator=generator,
    )
    batch_sampler.set_epoch(0)
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        generator=generator,
        **loader_kwargs,
    )
