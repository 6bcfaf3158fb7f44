"""What a micro-batch is made of: unpacking, item counting, splitting and moving batches.

Items are what the loss averages over (docs/accumulation.md, rules 1 and 15): for integer
targets the elements not equal to ``ignore_index`` (of ``labels[..., 1:]`` when the model
shifts them, as a causal LM does); for float targets what the loss is known to average over,
see ``ItemCounter``. A batch is ``(inputs, targets)``, ``{"inputs": ..., "targets": ...}``,
or a Hugging Face style mapping of keyword inputs whose ``labels`` are the targets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

Count = int | torch.Tensor


def unpack(batch: Any) -> tuple[Any, Any]:
    """(inputs, targets). A mapping other than {"inputs", "targets"} is keyword inputs (all of
    them, ``labels`` included, for a model that computes its own loss); its targets are its
    ``labels`` (None without)."""
    if type(batch) in (tuple, list) and len(batch) == 2:  # the common case, without ABC checks
        return batch[0], batch[1]
    if isinstance(batch, Sequence) and not isinstance(batch, str | bytes) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, Mapping):
        if "inputs" in batch and "targets" in batch:
            return batch["inputs"], batch["targets"]
        return batch, batch.get("labels")
    raise TypeError(
        "each batch must be (inputs, targets), {'inputs': ..., 'targets': ...} or a mapping of "
        f"keyword inputs with 'labels'; got {type(batch).__name__}"
    )


def forward(model: Any, inputs: Any) -> Any:
    """``model(**inputs)`` for a mapping of keyword inputs, else ``model(inputs)``."""
    # A tensor first: the Mapping check is an ABC's, ~1 us on every micro-batch.
    if not isinstance(inputs, torch.Tensor) and isinstance(inputs, Mapping):
        return model(**inputs)
    return model(inputs)


def count_items(targets: Any, ignore_index: int) -> Count:
    """Items in a micro-batch; a Python int when the targets are on the CPU (no device sync)."""
    if not isinstance(targets, torch.Tensor):
        raise TypeError(
            f"cannot count items of targets of type {type(targets).__name__}; "
            "pass Trainer(count_items=fn) with fn(inputs, targets) -> int"
        )
    if targets.is_floating_point() or targets.is_complex():
        return int(targets.shape[0]) if targets.dim() else 1
    if targets.is_cpu and not targets.requires_grad:  # (is_cpu: .device builds an object, ~1 us)
        # numpy shares the memory and counts several times faster than a torch op here.
        return int(np.count_nonzero(targets.numpy() != ignore_index))
    return (targets != ignore_index).sum()


COUNT_MODES = ("tokens", "rows")
# Losses that average over every element of their target (reduction="mean"): n_i = numel.
ELEMENTWISE_LOSSES: tuple[type[torch.nn.Module], ...] = (
    torch.nn.MSELoss, torch.nn.L1Loss, torch.nn.SmoothL1Loss, torch.nn.HuberLoss, torch.nn.BCELoss,
    torch.nn.BCEWithLogitsLoss,
)


class ItemCounter:
    """n_i of a micro-batch: the number of things its mean loss averages over.

    ``mode``:
    - ``"tokens"``: integer targets: the elements not equal to ``ignore_index``; float targets:
      every position: B for [B], B x T for [B, T], B x T for a [B, T, V] distribution per token;
    - ``"rows"``: the first dimension of the targets (samples); inferred for
      ``KLDivLoss(reduction="batchmean")``;
    - ``None``: inferred. Integer targets: tokens. Float targets: the elements for the
      element-wise losses (MSE, L1, smooth L1, Huber, BCE); numel / C for cross-entropy on
      [B, C, ...] class probabilities; rows for [B] or [B, 1]; for any other loss, rows as
      long as the targets' trailing shape stays the same (then any count per row weighs the
      same), and a ValueError when it changes (the count would be a guess).
    ``shift``: the labels are shifted before the loss (causal LM): count ``labels[..., 1:]``.
    None: not known; a mapping batch with sequence labels is then refused.
    """

    def __init__(self, mode: str | None, ignore_index: int, shift: bool | None, loss_fn: Any) -> None:
        if mode is not None and mode not in COUNT_MODES:
            raise ValueError(f"count_items must be 'tokens', 'rows', a callable or None, got {mode!r}")
        if mode is None and isinstance(loss_fn, torch.nn.KLDivLoss) and loss_fn.reduction == "batchmean":
            mode = "rows"  # batchmean is the sum over a sample's elements, averaged over samples
        self.mode = mode
        self.ignore_index = ignore_index
        self.shift = shift
        self.elementwise = isinstance(loss_fn, ELEMENTWISE_LOSSES)
        self.class_probabilities = isinstance(loss_fn, torch.nn.CrossEntropyLoss)
        self._trailing: tuple[int, ...] | None = None  # float targets, unknown loss: first shape

    def __call__(self, inputs: Any, targets: Any) -> Count:
        if not isinstance(targets, torch.Tensor):
            raise TypeError(
                f"cannot count items of targets of type {type(targets).__name__} (a mapping batch "
                "needs 'labels'); pass Trainer(count_items=fn) with fn(inputs, targets) -> int"
            )
        if self.mode == "rows":
            return int(targets.shape[0]) if targets.dim() else 1
        if not (targets.is_floating_point() or targets.is_complex()):
            if targets.dim() >= 2:
                if self.shift is None and isinstance(inputs, Mapping):
                    raise ValueError(
                        "cannot tell whether the model shifts these labels before its loss (a causal "
                        "LM scores labels[..., 1:]): pass Trainer(shift_labels=True) if it does, "
                        "Trainer(shift_labels=False) if it scores them in place"
                    )
                if self.shift:
                    targets = targets[..., 1:]
            return count_items(targets, self.ignore_index)
        rows = int(targets.shape[0]) if targets.dim() else 1
        if self.mode == "tokens":
            return targets.numel() // targets.shape[-1] if targets.dim() >= 3 else max(targets.numel(), 1)
        if targets.dim() <= 1 or targets.numel() == rows:
            return rows
        if self.elementwise:
            return targets.numel()
        if self.class_probabilities:
            return targets.numel() // targets.shape[1]
        trailing = tuple(targets.shape[1:])
        if self._trailing is None:
            self._trailing = trailing
        elif trailing != self._trailing:
            raise ValueError(
                f"cannot tell what loss_fn averages over: float targets of shape {list(targets.shape)} "
                f"after {[rows, *self._trailing]}, and a changing trailing shape changes the weights. "
                "Pass count_items='tokens' if it averages over every position (the B x T elements of "
                "[B, T] targets, the B x T positions of [B, T, V] distributions), count_items='rows' "
                "if over samples, or count_items=fn(inputs, targets)"
            )
        return rows


def normalise_count(count: Any) -> int | float | torch.Tensor:
    """A count from ``count_items`` as a Python number, or a tensor when it lives on a device."""
    if type(count) is int and count >= 0:
        return count
    if isinstance(count, torch.Tensor):
        if count.device.type != "cpu":
            return count  # reading it would be a device sync per micro-batch
        count = count.item()
    if isinstance(count, bool) or not isinstance(count, int | float | np.integer | np.floating):
        raise TypeError(
            f"count_items must return a number or a 0-d tensor, got {type(count).__name__}"
        )
    number = float(count)
    if number < 0:
        raise ValueError(f"count_items returned a negative count ({number})")
    return int(number) if number.is_integer() else number


def first_dim(inputs: Any) -> int:
    """Samples in a batch (first dimension of the first tensor found)."""
    if isinstance(inputs, torch.Tensor):
        return int(inputs.shape[0]) if inputs.dim() else 1
    if isinstance(inputs, Mapping):
        return first_dim(next(iter(inputs.values())))
    if isinstance(inputs, Sequence) and inputs:
        return first_dim(inputs[0])
    raise TypeError(f"cannot find the batch dimension of {type(inputs).__name__}")


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, Mapping):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(to_device(v, device) for v in value)
    return value


def empty_rows(value: Any) -> Any:
    """The same batch structure with 0 samples (the first 0 rows of every tensor)."""
    if isinstance(value, torch.Tensor):
        return value[:0] if value.dim() else value
    if isinstance(value, Mapping):
        return {k: empty_rows(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(empty_rows(v) for v in value)
    return value


def one_row(value: Any) -> Any:
    """The batch's first row, every tensor copied (no storage of the batch kept alive): the
    input of a pass that only joins the ranks' collectives (its output unused or times 0).
    One row, not 0: some models (Hugging Face attention) cannot reshape an empty batch."""
    if isinstance(value, torch.Tensor):
        return value[:1].clone() if value.dim() else value
    if isinstance(value, Mapping):
        return {k: one_row(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(one_row(v) for v in value)
    return value


def split(value: Any, parts: int | list[int]) -> list[Any]:
    """Split along the first dimension into ``parts`` nearly equal chunks (OOM back-off), or
    at the row indices ``parts`` lists (``torch.tensor_split``'s two forms)."""
    count = parts if isinstance(parts, int) else len(parts) + 1
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return [value] * count
        return list(torch.tensor_split(value, parts, dim=0))
    if isinstance(value, Mapping):
        pieces = {k: split(v, parts) for k, v in value.items()}
        return [{k: pieces[k][i] for k in value} for i in range(count)]
    if isinstance(value, tuple | list):
        columns = [split(v, parts) for v in value]
        return [type(value)(col[i] for col in columns) for i in range(count)]
    return [value] * count
