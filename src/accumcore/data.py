"""Data loaders whose order is a function of (seed, epoch), so a resumed run sees the same data.

    loader = make_loader(dataset, batch_size=32, shuffle=True, seed=0)
    loader = make_loader(dataset, batch_size=32, seed=0, rank=dist.get_rank(), world=dist.get_world_size())

The trainer calls ``loader.batch_sampler.set_epoch(epoch)``, ``set_window(accumulation_steps)``
and, when resuming mid-epoch, ``skip_batches(k)``: the skipped batches are never loaded. With
``rank`` and ``world`` every rank reads the whole dataset's order and runs its share of each
global window's micro-batches (``accumcore.world_order``): the trajectory does not depend on the
number of ranks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from accumcore.world_order import WindowLayout

# Mixes seed and epoch into one generator seed; any odd multiplier larger than the epoch
# count keeps (seed, epoch) pairs apart.
_EPOCH_MIX = 1_000_003
# Sets each rank's DataLoader worker seeds apart: the base seed a loader draws for rank r
# comes from a generator seeded r x this past rank 0's, not from rank 0's own.
_RANK_MIX = 7_919 << 32


class EpochBatchSampler(Sampler[list[int]]):
    """Yields index batches in an order fixed by (seed, epoch), resumable at any batch.

    With ``world`` > 1 it yields rank ``rank``'s share of each global window: the epoch's
    micro-batches are grouped ``set_window(G)`` at a time (G over all ranks; until set, one
    per rank) and each rank takes a contiguous slice (``accumcore.world_order``)."""

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_samples < 1:
            raise ValueError("the dataset is empty; a loader needs at least one sample")
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank must be in 0..world-1 and world >= 1, got rank={rank}, world={world}")
        self.rank = rank
        self.world = world
        self.window = world  # micro-batches per global window, all ranks together (set_window)
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._skip = 0
        # The DataLoader's generator seeds worker processes; re-seeding it per epoch makes
        # worker-side randomness a function of (seed, epoch, rank) too, and keeps the loader
        # from drawing on the global torch RNG (which would break exact resume). The rank is
        # mixed in (rank 0 keeps the one-process seed): worker w of every rank would otherwise
        # start from one seed and draw the same random transforms as rank 0's worker w.
        self._loader_generator = generator

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._skip = 0  # a skip is for the epoch it was asked in, even if that was never read
        if self._loader_generator is not None:
            self._loader_generator.manual_seed(self._mixed_seed() + 1 + self.rank * _RANK_MIX)

    def set_window(self, micro_batches: int) -> None:
        """G: the micro-batches of one optimizer step over all ranks (the trainer's
        ``accumulation_steps``); each rank runs its share of them."""
        if micro_batches < 1:
            raise ValueError(f"a window needs at least 1 micro-batch, got {micro_batches}")
        self.window = micro_batches

    def layout(self) -> WindowLayout:
        """The current epoch's global windows and this rank's share of each."""
        stop = self.num_samples - self.num_samples % self.batch_size if self.drop_last else self.num_samples
        return WindowLayout(stop, self.batch_size, self.window, self.rank, self.world)

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
        skip, self._skip = self._skip, 0
        if self.world == 1:
            stop = len(self) * self.batch_size if self.drop_last else self.num_samples
            for begin in range(skip * self.batch_size, stop, self.batch_size):
                yield order[begin : min(begin + self.batch_size, stop)]
            return
        layout = self.layout()
        mine = (b for w in range(layout.windows) for b in layout.rank_batches(w))
        for position in itertools.islice(mine, skip, None):
            batch = layout.batch(position)
            yield order[batch.start : batch.stop]

    def __len__(self) -> int:
        if self.world > 1:
            return sum(self.layout().sizes())
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
    rank: int = 0,
    world: int = 1,
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
        rank, world: this process's rank and the number of ranks (DDP). Every rank then
            orders the whole dataset the same way and runs its share of each global window,
            and the Trainer's ``accumulation_steps`` counts the micro-batches of a window over
            all ranks: 1, 2 or 3 ranks train on the same windows, so the same trajectory
            (docs/accumulation.md, "The same trajectory on any number of ranks").
    """
    if not isinstance(dataset, Sized):
        raise TypeError("make_loader needs a map-style dataset with __len__ (not an IterableDataset)")
    generator = torch.Generator()
    batch_sampler = EpochBatchSampler(
        len(dataset), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
        generator=generator, rank=rank, world=world,
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
