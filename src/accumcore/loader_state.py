"""What a loader draws at an epoch's start, saved so that a resumed run draws it again.

Rule 9 of docs/accumulation.md. Creating a ``DataLoader``'s iterator draws its base seed, from
``loader.generator`` or else from the global torch RNG; a ``RandomSampler`` draws its
permutation at the epoch's first batch, from its own generator or else from a seed taken from
the global torch RNG; dataset transforms draw on the global RNGs as batches load. So the
trainer captures, at each epoch's start and before creating the iterator, the global torch
RNG state and the state of every generator the loader iterates with (``capture``). A run
resumed inside an epoch puts those back (``restore``), re-creates the iterator, skips the
batches already trained on (their draws happen again, exactly as before), and only then
restores the RNG states of the window boundary it stopped at.

That replays any loader whose order is a function of those states: a DataLoader with a
sequential, random, subset-random, weighted-random or distributed sampler, with or without
generators, with worker processes that are started per epoch (their seeds come from the
base seed), and ``accumcore.data.make_loader``'s batch sampler (order from (seed, epoch)).
An ``IterableDataset`` that saves its own position (``state_dict`` / ``load_state_dict``, read
without worker processes) is restored to it instead (``stateful_dataset``). ``inexact_reason``
names the others: any other ``IterableDataset``, a custom sampler, persistent workers (their
RNG states outlive the epoch and are not saved; the trainer refuses them where a fit writes
or resumes from checkpoints, ``persistent_workers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

# Samplers whose order is a function of their generator (or the global RNG) and epoch.
REPLAYABLE_SAMPLERS = (SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler,
                       DistributedSampler)


def _replays_itself(loader: Any) -> bool:
    """A batch sampler whose order is a function of (seed, epoch), resumable by its own state
    (accumcore.data.EpochBatchSampler, under make_loader and DeviceBatches): nothing to save."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    return hasattr(batch_sampler, "load_state_dict") and hasattr(batch_sampler, "set_epoch")


def _data_loader(loader: Any) -> DataLoader[Any] | None:
    """The DataLoader itself, or the one a wrapper (fast_path.CudaPrefetcher) iterates."""
    if isinstance(loader, DataLoader):
        return loader
    inner = getattr(loader, "loader", None)
    return inner if isinstance(inner, DataLoader) else None


def _sampler(loader: DataLoader[Any]) -> Any:
    batch_sampler = loader.batch_sampler
    return batch_sampler.sampler if type(batch_sampler) is BatchSampler else batch_sampler


def generators(loader: Any) -> list[torch.Generator]:
    """The distinct generators the loader's iteration draws from, in a fixed order."""
    if isinstance(loader, Sequence) or _replays_itself(loader):
        return []
    batch_sampler = getattr(loader, "batch_sampler", None)
    owners = (loader, getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None))
    found: list[torch.Generator] = []
    for owner in owners:
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


def draws_global(loader: Any) -> bool:
    """Whether starting an epoch of ``loader`` may draw from the global torch RNG (a base
    seed without ``loader.generator``, a sampler without its own generator)."""
    if isinstance(loader, Sequence) or _replays_itself(loader):
        return False
    inner = _data_loader(loader)
    if inner is None or inner.generator is None:
        return True
    sampler = _sampler(inner)
    if isinstance(sampler, Sequence | SequentialSampler | DistributedSampler):
        return False
    return getattr(sampler, "generator", None) is None


def capture(loader: Any) -> dict[str, Any]:
    """The RNG states the loader's iterator draws from, before it is created (a copy of the
    torch RNG state only where the loader draws from it; nothing for make_loader's)."""
    return {
        "torch": torch.get_rng_state() if draws_global(loader) else None,
        "generators": [g.get_state() for g in generators(loader)],
    }


def restore_generators(loader: Any, state: dict[str, Any]) -> None:
    found = generators(loader)
    saved = state["generators"]
    if len(found) != len(saved):
        raise ValueError(
            f"the checkpoint's training loader iterated with {len(saved)} torch.Generator(s), this "
            f"one with {len(found)}; resume with a loader built the same way (generator=..., sampler=...)"
        )
    for generator, generator_state in zip(found, saved, strict=True):
        generator.set_state(generator_state.cpu())


def restore(loader: Any, state: dict[str, Any]) -> None:
    """Put back the epoch-start states of ``capture``; the next ``iter(loader)`` draws as then."""
    if state["torch"] is not None:
        torch.set_rng_state(state["torch"].cpu())
    restore_generators(loader, state)


def batches_per_epoch(loader: Any) -> int | None:
    """The loader's batches per epoch where its length is exact (a list, a map-style
    DataLoader, make_loader's and DeviceBatches' samplers), else None."""
    if isinstance(loader, Sequence):
        return len(loader)
    if _replays_itself(loader):
        return len(loader.batch_sampler)
    inner = _data_loader(loader)
    if inner is None or isinstance(inner.dataset, IterableDataset):
        return None
    return len(inner)


def stateful_dataset(loader: Any) -> Any | None:
    """The loader's IterableDataset when it saves its own position (``state_dict`` /
    ``load_state_dict``) and is read in this process (no workers, which would each hold a
    copy), else None. The trainer saves its state at window boundaries and, resuming inside an
    epoch, loads it back instead of skipping batches. The protocol (torchdata's ``Stateful``):
    after ``load_state_dict``, the next ``__iter__`` continues from the saved position; any
    other ``__iter__`` starts a new pass."""
    inner = _data_loader(loader)
    dataset = getattr(inner, "dataset", None)
    if (
        isinstance(dataset, IterableDataset)
        and callable(getattr(dataset, "state_dict", None))
        and callable(getattr(dataset, "load_state_dict", None))
        and inner is not None
        and inner.num_workers == 0
    ):
        return dataset
    return None


def inexact_reason(loader: Any) -> str | None:
    """Why a run resumed on ``loader`` would not be bitwise the uninterrupted one, or None."""
    if isinstance(loader, Sequence) or _replays_itself(loader):
        return None  # a list of batches; make_loader / DeviceBatches: order from (seed, epoch)
    inner = _data_loader(loader)
    if inner is None:
        return (
            f"{type(loader).__name__} is neither a DataLoader nor a list of batches, so the trainer "
            "cannot tell whether its order depends only on the RNG states it saves"
        )
    loader = inner
    if isinstance(loader.dataset, IterableDataset):
        if stateful_dataset(loader) is not None:
            return None  # its position is saved and loaded back
        return (
            f"the loader reads an IterableDataset ({type(loader.dataset).__name__}) without "
            "state_dict/load_state_dict (or through worker processes), so its position is not "
            "saved: a resumed run reads it again from the start and skips the batches already "
            "trained on, which is exact only if it yields the same items every time"
        )
    sampler = _sampler(loader)
    if not isinstance(sampler, Sequence) and type(sampler) not in REPLAYABLE_SAMPLERS:
        return (
            f"its sampler {type(sampler).__name__} is not one whose order the trainer can replay "
            "(sequential, random, subset-random, weighted-random, distributed, or "
            "accumcore.data.make_loader's); give it state_dict/load_state_dict and set_epoch"
        )
    if persistent_workers(loader):
        return PERSISTENT_WORKERS
    return None


PERSISTENT_WORKERS = (
    "its persistent worker processes keep their RNG states from epoch to epoch, and those are not "
    "saved: random transforms in a resumed run draw other numbers (0.058 off in the audit's run). "
    "Pass persistent_workers=False: workers are then started at each epoch from the base seed "
    "the trainer's saved RNG states reproduce, and a resume is bitwise exact"
)


def persistent_workers(loader: Any) -> bool:
    """A plain DataLoader (not one that replays itself) whose workers outlive the epoch."""
    inner = _data_loader(loader)
    return (inner is not None and not _replays_itself(inner) and inner.num_workers > 0
            and bool(inner.persistent_workers))
