"""Losses the trainer can weight by item counts (rules 1 and 15 of docs/accumulation.md).

``check_loss_fn`` refuses, when the trainer is built, what can be seen from the loss object:
a reduction other than mean, another ignore_index, class weights. A loss callable without a
``reduction`` attribute (a function, a lambda) says nothing, so ``check_mean_over_items``
checks it once, on the first micro-batch: its value on the micro-batch must be the
item-weighted mean of its values on the two halves. A sum (twice the mean, for two halves
alike) is refused, and so is a mean over something else than the items the trainer counts.
Declare ``reduction = "mean"`` on a loss to skip the check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from accumcore import items
from accumcore.rng import capture_rng_state, restore_rng_state


class ModelLossOrCrossEntropy(torch.nn.CrossEntropyLoss):
    """``Trainer(loss_fn=None)``: the model's own loss when its output carries one (a ``loss``
    attribute or key, as Hugging Face models return with ``labels``), else cross-entropy."""

    def __init__(self, ignore_index: int) -> None:
        super().__init__(ignore_index=ignore_index)

    def forward(self, outputs: Any, targets: Any) -> torch.Tensor:
        own = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
        if isinstance(own, torch.Tensor):
            return own
        if targets is None:
            raise ValueError(
                "the model returned no loss and the batch has no targets: pass batches with "
                "'labels' to a model that computes its loss, or pass loss_fn"
            )
        return super().forward(outputs, targets)


def check_loss_fn(
    loss_fn: Callable[[Any, Any], torch.Tensor], ignore_index: int, custom_counter: bool
) -> None:
    """Refuse losses whose value is not a mean over the items the trainer counts."""
    reduction = getattr(loss_fn, "reduction", "mean")
    if reduction == "batchmean" and isinstance(loss_fn, torch.nn.KLDivLoss):
        return  # the KL divergence per sample, averaged over rows: counted as rows (items.ItemCounter)
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


def check_mean_over_items(
    model: torch.nn.Module,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    micro_batches: list[Any],
    counter: Callable[[Any, Any], Any],
    device: torch.device,
) -> bool:
    """Check that ``loss_fn`` is the mean over the counted items on the first micro-batch
    with two rows or more and items in both halves; False when none has (check later).

    Runs without gradients, in eval mode and with every RNG put back, so it changes nothing
    the training run draws or computes (each submodule's own mode is restored).
    """
    modes = [(m, m.training) for m in model.modules()]
    rng = capture_rng_state()
    model.eval()
    try:
        for mb in micro_batches:
            if mb.samples < 2:
                continue
            inputs, targets = mb.load()
            halves = list(zip(items.split(inputs, 2), items.split(targets, 2), strict=True))
            counts = [float(items.normalise_count(counter(i, t))) for i, t in halves]  # once: a sync is fine
            if min(counts) <= 0:
                continue
            values = [_loss_value(model, loss_fn, i, t, device) for i, t in [(inputs, targets), *halves]]
            if any(v is None for v in values):
                return True  # not a scalar: the window's own check says how to fix that
            whole, first, second = (float(v) for v in values)  # type: ignore[arg-type]
            mean = (first * counts[0] + second * counts[1]) / (counts[0] + counts[1])
            tolerance = torch.finfo(values[0].dtype).eps ** 0.5  # type: ignore[union-attr]
            if _close(whole, mean, tolerance):
                return True
            if _close(whole, first + second, tolerance):
                raise ValueError(
                    f"loss_fn returns a sum over the micro-batch, not a mean ({whole:.6g} on the "
                    f"micro-batch, {first:.6g} + {second:.6g} on its halves); accumcore weights each "
                    "micro-batch's mean loss by its item count: return the mean (reduction='mean')"
                )
            raise ValueError(
                f"loss_fn's value on a micro-batch ({whole:.6g}) is neither the mean over the items "
                f"the trainer counts (expected {mean:.6g} from its halves, {counts[0]:g} and "
                f"{counts[1]:g} items) nor a sum: pass count_items='tokens', 'rows' or "
                "fn(inputs, targets) counting what it averages over; set loss_fn.reduction = 'mean' "
                "to skip this check"
            )
        return False
    finally:
        for module, training in modes:
            module.training = training
        restore_rng_state(rng)


def _loss_value(
    model: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], inputs: Any, targets: Any,
    device: torch.device,
) -> torch.Tensor | None:
    with torch.no_grad():
        loss = loss_fn(items.forward(model, items.to_device(inputs, device)), items.to_device(targets, device))
    return loss.detach() if isinstance(loss, torch.Tensor) and loss.dim() == 0 else None


def _close(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(abs(a), abs(b), 1e-30)
