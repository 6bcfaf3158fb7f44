"""What a micro-batch is made of: unpacking, item counting, splitting and moving batches.

Items are what the loss averages over (ACCUMULATION.md, rule 1): for integer targets the
elements not equal to ``ignore_index``; for float targets the first dimension.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

ItemCounter = Callable[[Any, Any], "int | torch.Tensor"]
Count = int | torch.Tensor


def unpack(batch: Any) -> tuple[Any, Any]:
    if type(batch) in (tuple, list) and len(batch) == 2:  # the common case, without ABC checks
        return batch[0], batch[1]
    if isinstance(batch, Sequence) and not isinstance(batch, str | bytes) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, Mapping) and "inputs" in batch and "targets" in batch:
        return batch["inputs"], batch["targets"]
    raise TypeError(
        "each batch must be (inputs, targets) or {'inputs': ..., 'targets': ...}; "
        f"got {type(batch).__name__}"
    )


def count_items(targets: Any, ignore_index: int) -> Count:
    """Items in a micro-batch; a Python int when the targets are on the CPU (no device sync)."""
    if not isinstance(targets, torch.Tensor):
        raise TypeError(
            f"cannot count items of targets of type {type(targets).__name__}; "
            "pass Trainer(count_items=fn) with fn(inputs, targets) -> int"
        )
    if targets.is_floating_point() or targets.is_complex():
        return int(targets.shape[0]) if targets.dim() else 1
    if targets.device.type == "cpu" and not targets.requires_grad:
        # numpy shares the memory and counts several times faster than a torch op here.
        return int(np.count_nonzero(targets.numpy() != ignore_index))
    return (targets != ignore_index).sum()


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


def split(value: Any, parts: int) -> list[Any]:
    """Split along the first dimension into ``parts`` nearly equal chunks (OOM back-off)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return [value] * parts
        return list(torch.tensor_split(value, parts, dim=0))
    if isinstance(value, Mapping):
        pieces = {k: split(v, parts) for k, v in value.items()}
        return [{k: pieces[k][i] for k in value} for i in range(parts)]
    if isinstance(value, tuple | list):
        columns = [split(v, parts) for v in value]
        return [type(value)(col[i] for col in columns) for i in range(parts)]
    return [value] * parts
