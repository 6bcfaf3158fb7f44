"""Checks that a loss function can be weighted by item counts (rule 1 of ACCUMULATION.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def check_loss_fn(
    loss_fn: Callable[[Any, Any], torch.Tensor], ignore_index: int, custom_counter: bool
) -> None:
    """Refuse losses whose value is not a mean over the items the trainer counts."""
    reduction = getattr(loss_fn, "reduction", "mean")
    if reduction != "mean":
        raise ValueError(
            f"loss_fn has reduction={reduction!r}; accumcore weights each micro-batch's mean "
            "loss by its item count, so pass reduction='mean' "
            f"(e.g. {type(loss_fn).__name__}(reduction='mean'))"
        )
    if custom_counter:
        return
    loss_ignore = getattr(loss_fn, "ignore_index", None)
    if loss_ignore is not None and loss_ignore != ignore_index:
        raise ValueError(
            f"loss_fn ignores targets equal to {loss_ignore} but the trainer counts items with "
            f"ignore_index={ignore_index}; pass Trainer(ignore_index={loss_ignore})"
        )
    if getattr(loss_fn, "weight", None) is not None:
        raise ValueError(
            "loss_fn has class weights, so its mean is over weights, not items; pass "
            "Trainer(count_items=fn) with fn(inputs, targets) returning the summed weights"
        )
