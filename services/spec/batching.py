"""Batch geometry of a spec: effective batch, N per epoch, optimizer steps per run.

Schedules are sized in optimizer steps: an epoch of S samples on w GPUs gives each rank
ceil(S / w) samples, ceil(ceil(S / w) / m) micro-batches and ceil(micro_batches / N) windows,
the last one possibly short (it still steps the optimizer once).
"""

from __future__ import annotations

from math import ceil

from services.catalog import configured_dataset
from services.spec.job import AUTO, JobSpec
from services.spec.world import world_of


def world_size(spec: JobSpec) -> int:
    """Processes taking part in one optimizer step: nodes x gpus (CPU counts as one)."""
    return world_of(spec.gpus, spec.nodes)


def micro_batch_size(spec: JobSpec) -> int | None:
    """m, or None while it is "auto" (chosen on the device by the worker)."""
    return None if spec.micro_batch_size == AUTO else int(spec.micro_batch_size)


def accumulation_at(spec: JobSpec, epoch: int) -> int | None:
    """N for `epoch` (the schedule entry with the largest epoch <= `epoch`); None with "auto"."""
    steps = spec.accumulation_steps
    if steps is None:
        micro = micro_batch_size(spec)
        if micro is None:
            return None
        assert spec.effective_batch_size is not None  # the spec validator guarantees one of them
        return spec.effective_batch_size // world_size(spec) // micro
    if isinstance(steps, int):
        return steps
    return steps[str(max(int(e) for e in steps if int(e) <= epoch))]


def effective_batch_size(spec: JobSpec, epoch: int = 0) -> int:
    """Samples per optimizer step (m x N x gpus) at `epoch`; fixed when given in the spec."""
    if spec.effective_batch_size is not None:
        return spec.effective_batch_size
    steps, micro = accumulation_at(spec, epoch), micro_batch_size(spec)
    assert steps is not None and micro is not None  # "auto" always comes with effective_batch_size
    return micro * steps * world_size(spec)


def steps_per_epoch(spec: JobSpec, epoch: int, train_size: int | None = None) -> int:
    """Optimizer steps in `epoch`, counting the short last window.

    Raises ValueError when the size is not known before the data is read (your own data)."""
    size = (
        configured_dataset(spec.dataset.name, spec.dataset.options).train_size
        if train_size is None
        else train_size
    )
    if size is None:
        raise ValueError(f"dataset {spec.dataset.name!r} has no size until the worker reads it")
    micro, steps = micro_batch_size(spec), accumulation_at(spec, epoch)
    if micro is None or steps is None:
        # "auto": ceil(ceil(x / m) / G) == ceil(x / (m G)), so the count does not depend on m.
        return ceil(size / effective_batch_size(spec))
    # Global windows of N x world micro-batches over the whole epoch's order, the same on any
    # number of ranks (accumcore.world_order).
    return ceil(ceil(size / micro) / (steps * world_size(spec)))


def total_optimizer_steps(spec: JobSpec, train_size: int | None = None) -> int | None:
    """Optimizer steps the whole run takes: `max_steps`, or the sum over its epochs.

    `train_size` defaults to the catalog's size of the dataset's training split; None when
    that is unknown before the worker reads the data (your own data: the worker sets it).
    """
    if spec.max_steps is not None:
        return spec.max_steps
    assert spec.epochs is not None
    if train_size is None and configured_dataset(spec.dataset.name, spec.dataset.options).train_size is None:
        return None
    # Sum per schedule segment, not per epoch: epochs may be large, segments are few.
    starts = (
        sorted(int(e) for e in spec.accumulation_steps)
        if isinstance(spec.accumulation_steps, dict)
        else [0]
    )
    bounds = [s for s in starts if s < spec.epochs] + [spec.epochs]
    return sum(
        (end - start) * steps_per_epoch(spec, start, train_size)
        for start, end in zip(bounds, bounds[1:], strict=False)
    )


def batch_over_data(spec: JobSpec, train_size: int) -> tuple[str, str] | None:
    """(field, message) when a step of `spec` asks for more samples than the training split
    holds: each optimizer step would then see the whole split, not the batch asked for (the
    window is cut short), silently a different run. None when it fits, or with "auto"."""
    micro = micro_batch_size(spec)
    if micro is None and spec.effective_batch_size is None:
        return None
    steps = spec.accumulation_steps
    schedule = [int(e) for e in steps] if isinstance(steps, dict) else [0]
    effective = max(effective_batch_size(spec, epoch) for epoch in schedule)
    if effective <= train_size:
        return None
    world = world_size(spec)
    ranks = f" x {world} ranks" if world > 1 else ""
    if spec.effective_batch_size is not None:
        asked = f"effective_batch_size {effective:,}"
    else:
        most = max(accumulation_at(spec, epoch) or 0 for epoch in schedule)
        asked = f"micro_batch_size {micro:,} x accumulation_steps {most:,}{ranks} = {effective:,}"
    whole = micro is not None and micro * world > train_size
    field = ("micro_batch_size" if whole else "effective_batch_size"
             if spec.effective_batch_size is not None else "accumulation_steps")
    return field, (
        f"{asked} samples a step is more than the {train_size:,} training samples of dataset "
        f"{spec.dataset.name!r}{' (one micro-batch holds them all)' if whole else ''}: every "
        f"step would see those {train_size:,}, not {effective:,}. Lower {field} so that a step "
        f"takes at most {train_size:,}")
