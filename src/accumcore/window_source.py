"""Counting a window's items from its targets alone, and loading its inputs just in time.

Rule 2 of docs/accumulation.md: the window's item total W must be known before its first
backward. Loading the window's N micro-batches ahead gives W, but holds N micro-batches of
inputs at once (the whole memory cost of accumulation on the host). When the loader is a
single-process ``DataLoader`` (e.g. ``accumcore.data.make_loader``) over a dataset whose
targets can be read without its inputs, the trainer instead reads the window's index
batches, counts items from their targets, and loads each micro-batch's inputs right before
its forward: one micro-batch of inputs alive at a time. Targets are read from, in order:

- ``loader.targets_for(indices)``: a hook set on the loader (any collate function);
- a ``TensorDataset`` of (inputs, targets) with the default collate function;
- a ``targets`` tensor/list attribute of the dataset, with the default collate function and
  no ``target_transform``.

The counts of the hook and the ``targets`` attribute are checked against the loaded batch
(a mismatch is a clear error, never a silently wrong weight). Any other loader keeps the
read-ahead, which is exact for any data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, default_collate

from accumcore.items import ItemCounter, count_items

TargetsFor = Callable[[list[int]], Any]


class PendingBatch:
    """A loader batch known by its indices; its targets are read when first asked for (its
    count mostly needs none: ``TargetSource.count_for``), its inputs loaded on demand."""

    __slots__ = ("indices", "source", "_targets")

    def __init__(self, indices: list[int], targets: Any, source: TargetSource) -> None:
        self.indices = indices
        self.source = source
        self._targets = targets  # None: not read yet

    @property
    def targets(self) -> Any:
        if self._targets is None:
            self._targets = self.source.targets_for(self.indices)
        return self._targets


class TargetSource:
    """Reads targets by index, and loads whole batches, the way the DataLoader would."""

    def __init__(
        self,
        loader: DataLoader[Any],
        targets_for: TargetsFor,
        verify: bool,
        count: Callable[[Any, Any], Any],
        count_for: Callable[[list[int]], int] | None = None,
    ) -> None:
        self.loader = loader
        self.count = count  # the trainer's counter, to check the loaded batch's count when ``verify``
        self.targets_for = targets_for
        self.verify = verify  # False only where the targets are the collated ones by construction
        # ``count(None, targets_for(indices))`` from the indices alone, where it can be (``indexed_count``)
        self.count_for = count_for
        # The dataset's __getitems__ (or None), looked up once as the DataLoader's fetcher does
        # (looking for a missing attribute costs ~1 us a micro-batch).
        self._fetch_many: Any = getattr(loader.dataset, "__getitems__", None)

    def batches(self, skip: int) -> Iterator[PendingBatch]:
        """The epoch's batches from batch ``skip`` on, without loading any inputs.

        The iterator is created and the skipped index batches are drawn now (not at the first
        ``next``), so that a resumed run replays them before its RNG states are restored."""
        # Creating the DataLoader's iterator draws its base seed (from the global RNG when the
        # loader has no generator); doing the same keeps every RNG draw where it was.
        iter(self.loader)
        batch_sampler: Any = self.loader.batch_sampler
        if skip and hasattr(batch_sampler, "skip_batches"):
            batch_sampler.skip_batches(skip)
            skip = 0
        index_batches = iter(batch_sampler)
        for _ in range(skip):
            next(index_batches, None)  # indices only: nothing is loaded
        return self._pending(index_batches)

    def _pending(self, index_batches: Iterator[Any]) -> Iterator[PendingBatch]:
        for indices in index_batches:
            yield PendingBatch(list(indices), None, self)

    def load(self, indices: list[int]) -> Any:
        """Fetch and collate exactly as the single-process DataLoader does."""
        dataset: Any = self.loader.dataset
        fetch_many = self._fetch_many
        data = fetch_many(indices) if fetch_many else [dataset[i] for i in indices]
        return self.loader.collate_fn(data)


def target_source(
    loader: Any, custom_counter: bool, ignore_index: int = -100, count: Callable[[Any, Any], Any] | None = None
) -> TargetSource | None:
    """A ``TargetSource`` when the window can be counted from targets alone, else None.
    ``count(inputs, targets)`` re-counts loaded batches (default: non-ignored elements)."""
    counter = count or (lambda _inputs, targets: count_items(targets, ignore_index))
    if custom_counter:
        return None  # a user's count_items(inputs, targets) may need the inputs
    if not isinstance(loader, DataLoader) or type(loader).__iter__ is not DataLoader.__iter__:
        return None
    if loader.num_workers != 0 or loader.pin_memory or loader.batch_sampler is None:
        return None  # worker processes and pinning stay with the DataLoader's own iterator
    dataset: Any = loader.dataset
    if isinstance(dataset, IterableDataset):
        return None
    hook = getattr(loader, "targets_for", None)
    if callable(hook):
        return TargetSource(loader, hook, verify=True, count=counter)
    if loader.collate_fn is not default_collate:
        return None
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        targets = dataset.tensors[1]
        return TargetSource(loader, rows_of(targets), verify=False, count=counter,
                            count_for=indexed_count(targets, counter))
    stored = getattr(dataset, "targets", None)
    if stored is None or getattr(dataset, "target_transform", None) is not None:
        return None
    if isinstance(stored, torch.Tensor):
        return TargetSource(loader, rows_of(stored), verify=True, count=counter,
                            count_for=indexed_count(stored, counter))
    if isinstance(stored, list | tuple):
        return TargetSource(loader, lambda indices: torch.as_tensor([stored[i] for i in indices]), verify=True, count=counter)
    return None


def rows_of(targets: torch.Tensor) -> TargetsFor:
    """``targets[indices]`` for a list of indices, the same values and dtype. A CPU tensor
    that numpy can share is indexed through numpy: a micro-batch's 8 rows in ~7 us, where
    torch's indexing with a Python list takes ~30 us (once per micro-batch, the largest
    cost of the Trainer over a hand loop on a small model, bench/trainer/host_cost.py)."""
    try:
        array = targets.numpy()  # shares memory: no copy, and sees in-place changes too
    except (RuntimeError, TypeError):  # on a device, requires grad, or a dtype numpy lacks
        return lambda indices: targets[indices]
    return lambda indices: torch.from_numpy(array[indices])


def indexed_count(targets: torch.Tensor, count: Callable[[Any, Any], Any]) -> Callable[[list[int]], int] | None:
    """``count(None, targets[indices])`` from the indices alone, for the trainer's own
    ``ItemCounter`` on 1-D targets that numpy can share: the rows, or for integer targets
    those not equal to ignore_index, counted in numpy without a tensor made per micro-batch
    (~2 us where reading the targets and counting them took ~5, bench/trainer/host_cost.py).
    None for anything else, which is counted from its targets."""
    if type(count) is not ItemCounter or targets.dim() != 1 or targets.requires_grad:
        return None
    try:
        array = targets.numpy()  # shares memory, as ``rows_of``
    except (RuntimeError, TypeError):
        return None
    if count.mode == "rows" or targets.is_floating_point() or targets.is_complex():
        return len  # 1-D: a row is an item (ItemCounter's rule for [B] targets)
    ignore_index = count.ignore_index
    return lambda indices: int(np.count_nonzero(array[indices] != ignore_index))


def reads_window_ahead(loader: Any, count_items: Callable[..., Any] | None = None) -> bool:
    """True when the Trainer must load a window's N micro-batches ahead (see module doc)."""
    return target_source(loader, custom_counter=count_items is not None) is None


def split_indices(indices: list[int], parts: int) -> list[list[int]]:
    """The partition ``torch.tensor_split`` makes of a batch of len(indices) (OOM back-off)."""
    size, extra = divmod(len(indices), parts)
    pieces, start = [], 0
    for part in range(parts):
        stop = start + size + (1 if part < extra else 0)
        pieces.append(indices[start:stop])
        start = stop
    return pieces
