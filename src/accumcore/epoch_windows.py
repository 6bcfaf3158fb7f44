"""The trainer's side of ``accumcore.world_order``: an epoch's windows, and where a resume is.

A loader whose batch sampler knows the windows (``set_window`` / ``layout``: make_loader's and
DeviceBatches' ``EpochBatchSampler``) is told the accumulation steps at each epoch's start and
says how many micro-batches this rank runs in each window. A resumed run finds its window
from the checkpoint's position in global samples, which names the same boundary on any number
of ranks; older checkpoints, and loaders that shard the data per rank themselves, find it from
the window index or the rank's own batch count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accumcore import distributed
from accumcore.world_order import WindowLayout


def windowed_sampler(loader: Any) -> Any | None:
    """The loader's batch sampler when it groups the epoch into windows itself, else None."""
    sampler = getattr(loader, "batch_sampler", None)
    return sampler if callable(getattr(sampler, "set_window", None)) and callable(getattr(sampler, "layout", None)) else None


def configure(sampler: Any, accumulation_steps: int, ddp: bool) -> WindowLayout:
    """Give the sampler this epoch's window (``accumulation_steps`` micro-batches over all its
    ranks) and return its layout; refuse a rank or world that is not this process's."""
    if sampler.world > 1:
        world, rank = distributed.world_size(), distributed.rank()
        if not ddp or (sampler.rank, sampler.world) != (rank, world):
            unwrapped = "" if ddp else " and the model is not wrapped in DistributedDataParallel"
            raise ValueError(
                f"the training loader was made for rank {sampler.rank} of world {sampler.world} "
                f"(make_loader(rank=..., world=...)), but this process is rank {rank} of {world}"
                f"{unwrapped}; pass rank=dist.get_rank(), world=dist.get_world_size() and wrap "
                "the model in DistributedDataParallel"
            )
    sampler.set_window(accumulation_steps)
    layout: WindowLayout = sampler.layout()
    return layout


def covers_world(sampler: Any) -> bool:
    """Whether the sampler orders the data of every rank (world-aware, or one process), so a
    position in global samples is one in its own order; False for a per-rank shard's."""
    return int(sampler.world) == distributed.world_size()


def resume_window(
    layout: WindowLayout, progress: Mapping[str, Any], batch_in_epoch: int, global_order: bool
) -> int:
    """The window a run resumed inside an epoch starts with: from the global samples consumed
    (``global_order``: the sampler covers every rank), else the saved window index, else (a
    checkpoint from before both were saved) the rank's batches already stepped on."""
    samples = progress.get("samples_in_epoch")
    if global_order and samples is not None:
        return layout.window_at(int(samples))
    if progress.get("window_in_epoch") is not None:
        return int(progress["window_in_epoch"])
    done = 0
    for window, size in enumerate(layout.sizes()):
        if done == batch_in_epoch:
            return window
        done += size
    if done == batch_in_epoch:
        return layout.windows
    raise ValueError(
        f"the checkpoint stopped {batch_in_epoch} batches into the epoch, which is not a window "
        f"boundary of this loader ({layout.per_window} micro-batches per window); resume with the "
        "same batch_size and accumulation_steps"
    )
