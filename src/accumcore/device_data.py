"""A dataset held on the device, sampled there: no loader workers, no host-to-device copies.

For the small datasets (digits, mnist, fashion_mnist, cifar10: at most 60,000 images of
3x32x32) the whole training set is a few hundred MB as float32, so it fits on any GPU and a
DataLoader would only starve it. `DeviceBatches` stacks the dataset into two tensors on the
device once, then each micro-batch is one indexing kernel.

Order and resume: sampling is delegated to `accumcore.data.EpochBatchSampler`, the sampler
`make_loader` uses, exposed as `batch_sampler` just like a DataLoader's. So the order of epoch
e is the same function of (seed, e), micro-batch for micro-batch, as with `make_loader`, and
the trainer's `batch_sampler.set_epoch(e)` / `skip_batches(k)` / `state_dict()` resume it
exactly:

    batches = DeviceBatches.from_dataset(dataset, batch_size=64, seed=0, device="cuda")
    trainer.fit(batches, epochs=3)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from accumcore.data import EpochBatchSampler

SMALL_DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10")
# Keep room on the device for the model, activations and the optimizer.
DEFAULT_DEVICE_FRACTION = 0.25


def fits_on_device(
    nbytes: int, device: str | torch.device, fraction: float = DEFAULT_DEVICE_FRACTION
) -> bool:
    """Whether `nbytes` take at most `fraction` of the device's free memory (always on CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return True
    free, _total = torch.cuda.mem_get_info(device)
    return nbytes <= fraction * free


class DeviceBatches:
    """Micro-batches sliced from (inputs, targets) tensors that live on `device`.

    Behaves like the DataLoader of `make_loader` for the trainer: `len()` is the number of
    micro-batches per epoch, `batch_sampler` is an `EpochBatchSampler`, and iterating yields
    the micro-batches of the sampler's current epoch (from the skipped-to batch on resume).
    """

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        device: str | torch.device = "cpu",
        drop_last: bool = False,
    ) -> None:
        if len(inputs) != len(targets):
            raise ValueError(
                f"inputs and targets must have the same length, got {len(inputs)} and {len(targets)}"
            )
        self.batch_sampler = EpochBatchSampler(
            len(inputs), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self.device = torch.device(device)
        self.inputs = inputs.to(self.device)
        self.targets = targets.to(self.device)
        self.batch_size = batch_size

    @classmethod
    def from_dataset(
        cls,
        dataset: Dataset[Any],
        batch_size: int,
        *,
        device: str | torch.device = "cpu",
        fraction: float = DEFAULT_DEVICE_FRACTION,
        **kwargs: Any,
    ) -> DeviceBatches:
        """Stack a map-style dataset of (input, target) pairs onto the device.

        Raises:
            ValueError: the stacked dataset would take more than `fraction` of the device's
                free memory; use `accumcore.data.make_loader` for it instead.
        """
        stacked = list(DataLoader(dataset, batch_size=1024, shuffle=False))
        inputs = torch.cat([torch.as_tensor(batch[0]) for batch in stacked])
        targets = torch.cat([torch.as_tensor(batch[1]) for batch in stacked])
        nbytes = inputs.nbytes + targets.nbytes
        if not fits_on_device(nbytes, device, fraction):
            raise ValueError(
                f"the dataset takes {nbytes / 2**20:.0f} MiB, more than {fraction:.0%} of the free "
                f"memory of {device}; use accumcore.data.make_loader for it instead"
            )
        return cls(inputs, targets, batch_size, device=device, **kwargs)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self.batch_sampler.order()
        # One host-to-device copy of the epoch's order; each micro-batch is then a slice of
        # it (no per-batch copy, no sync).
        order_on_device = torch.tensor(order, dtype=torch.long, device=self.device)
        offset: int | None = None
        for indices in self.batch_sampler:
            if offset is None:
                # The sampler yields consecutive slices of `order`, starting after the
                # skipped batches when resuming: the first index says where.
                offset = order.index(indices[0])
            chosen = order_on_device[offset : offset + len(indices)]
            offset += len(indices)
            yield self.inputs[chosen], self.targets[chosen]


def fast_loader(
    dataset: Dataset[Any],
    batch_size: int,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    name: str | None = None,
    shuffle: bool = True,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    num_workers: int = 0,
) -> Any:
    """The fastest exact training loader for `dataset` on `device`, for `Trainer.fit`.

    - A small catalog dataset (`name` in SMALL_DATASETS, default collate, and it fits in a
      quarter of the device's free memory): `DeviceBatches`, held on the device.
    - Anything else: `make_loader` with pinned memory and persistent workers on CUDA
      (`fast_path.loader_kwargs`), wrapped in `fast_path.CudaPrefetcher` (a no-op on CPU).
    Both give the micro-batches of `make_loader(dataset, batch_size, shuffle, seed)` in the
    same order, so a run is the same whichever is picked. Only use it for datasets whose
    transforms are deterministic (the catalog's are): DeviceBatches applies them once.
    """
    from accumcore import fast_path
    from accumcore.data import make_loader

    if name in SMALL_DATASETS and collate_fn is None:
        try:
            return DeviceBatches.from_dataset(dataset, batch_size, device=device, seed=seed, shuffle=shuffle)
        except ValueError:
            pass  # does not fit: stream it instead
    loader = make_loader(
        dataset, batch_size, shuffle=shuffle, seed=seed, collate_fn=collate_fn,
        **fast_path.loader_kwargs(device, num_workers),
    )
    return fast_path.CudaPrefetcher(loader, device)
