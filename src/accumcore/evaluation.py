"""Validation: item-weighted loss and accuracy over non-ignored items, one sync at the end."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from accumcore import distributed, items, sharding
from accumcore.precision import Precision
from accumcore.rng import capture_rng_state, restore_rng_state


def evaluate(
    model: torch.nn.Module,
    loader: Iterable[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    precision: Precision,
    device: torch.device,
    counter: Callable[[Any, Any], int | torch.Tensor],
    ignore_index: int,
    shift_labels: bool = False,
) -> dict[str, float]:
    """``val_loss`` (mean over all items) and, for class/token targets, ``val_accuracy``
    (of ``outputs[..., :-1, :]`` against ``targets[..., 1:]`` with ``shift_labels``).

    Runs on the unwrapped module (no DDP collectives per batch) and leaves every RNG as it
    found it, so evaluating never changes what training draws next (exact resume).
    """
    sharded = sharding.is_sharded(model)
    use_ddp = distributed.ddp_wrapped(model) or sharded
    module = distributed.unwrap(model)
    # FSDP: each forward all-gathers, so every rank runs as many as the rank with the most
    # batches (the loaders' lengths), the missing ones on one row (output unused); a rank with
    # no batch at all takes a row of another rank's first batch.
    passes, batchless_ranks = _most_batches(loader, model) if sharded else (0, 0)
    empty: Any = None
    rng = capture_rng_state()
    if batchless_ranks and passes:
        empty = sharding.shared_empty_rows(_first_empty_rows(loader))
        restore_rng_state(rng)  # the loop below reads that batch again, drawing the same
    # Per-module modes, so a BatchNorm the user froze in eval mode stays frozen afterwards.
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    item_total: float | torch.Tensor = 0
    scored: int | torch.Tensor = 0
    try:
        with torch.no_grad():
            for batch in loader:
                inputs, targets = items.unpack(batch)
                count = items.normalise_count(counter(inputs, targets))
                passes -= 1
                if sharded:
                    empty = items.one_row(inputs)
                if not isinstance(count, torch.Tensor) and count == 0:
                    if sharded:  # nothing to score, but the forward's all-gathers to join
                        items.forward(module, items.to_device(inputs, device))
                    continue
                inputs = items.to_device(inputs, device)
                targets = items.to_device(targets, device)
                with precision.autocast():
                    outputs = items.forward(module, inputs)
                    loss = loss_fn(outputs, targets)
                loss = loss.detach().to(torch.float64)
                if isinstance(count, torch.Tensor):
                    # A device count of 0 (every target ignored): 0/0 x 0 is NaN, select 0.
                    loss = torch.where(count > 0, loss, torch.zeros_like(loss))
                loss_sum += loss * count
                item_total = item_total + count
                if shift_labels and _is_classification(outputs, targets) and targets.dim() >= 2:
                    outputs, targets = outputs[..., :-1, :], targets[..., 1:]
                if _is_classification(outputs, targets):
                    mask = targets != ignore_index
                    correct += (outputs.argmax(dim=-1).eq(targets) & mask).sum()
                    scored = scored + mask.sum()
            for _ in range(passes if empty is not None else 0):
                items.forward(module, items.to_device(empty, device))
    finally:
        for submodule, training in modes:
            submodule.training = training
        restore_rng_state(rng)
    values = [loss_sum, item_total, correct, scored]
    if use_ddp:
        totals = distributed.all_reduce_sum(values, distributed.comm_device(model)).tolist()
    else:
        totals = torch.stack(
            [torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in values]
        ).tolist()
    loss_total, n_items, n_correct, n_scored = totals
    if n_items == 0:
        raise ValueError("the validation loader yielded no items (all targets ignored or empty)")
    metrics = {"val_loss": loss_total / n_items}
    if n_scored > 0:
        metrics["val_accuracy"] = n_correct / n_scored
    return metrics


def _first_empty_rows(loader: Iterable[Any]) -> Any:
    """One row of the loader's first batch's inputs; None when it has none."""
    for batch in loader:
        return items.one_row(items.unpack(batch)[0])
    return None


def _most_batches(loader: Iterable[Any], model: torch.nn.Module) -> tuple[int, int]:
    """The largest of the ranks' validation loader lengths, and how many ranks have none (a
    collective)."""
    try:
        own = len(loader)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(
            "evaluating a sharded (FSDP) model needs a validation loader with a length on every "
            "rank (each forward is a collective): use a map-style dataset"
        ) from None
    world = distributed.world_size()
    slots = [0.0] * world
    slots[distributed.rank()] = float(own)
    reduced = distributed.all_reduce_sum([*slots, 1.0 if own == 0 else 0.0], distributed.comm_device(model))
    *lengths, batchless = reduced.tolist()
    return int(max(lengths)), int(batchless)


def _is_classification(outputs: Any, targets: Any) -> bool:
    return (
        isinstance(outputs, torch.Tensor)
        and isinstance(targets, torch.Tensor)
        and not targets.is_floating_point()
        and outputs.dim() == targets.dim() + 1
        and outputs.shape[:-1] == targets.shape
    )
