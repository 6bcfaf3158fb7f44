"""Per-step metrics, gathered with a single device sync per optimizer step."""

from __future__ import annotations

from typing import Any

import torch


def to_floats(values: dict[str, Any]) -> dict[str, float]:
    """Convert a dict of Python numbers and 0-d tensors with one sync for all tensors."""
    tensor_keys = [
        k for k, v in values.items() if isinstance(v, torch.Tensor) and v.device.type != "cpu"
    ]
    values = {k: v.item() if k not in tensor_keys and isinstance(v, torch.Tensor) else v for k, v in values.items()}
    result = {k: float(v) for k, v in values.items() if k not in tensor_keys and v is not None}
    if tensor_keys:
        device = values[tensor_keys[0]].device
        stacked = torch.stack(
            [values[k].detach().to(device=device, dtype=torch.float64).reshape(()) for k in tensor_keys]
        )
        for key, value in zip(tensor_keys, stacked.tolist(), strict=True):
            result[key] = value
    return result


def peak_memory_bytes(device: torch.device) -> float | None:
    """``torch.cuda.max_memory_allocated``, read once per step without its cost: that call
    flattens the allocator's whole stats tree into a sorted dict of dotted keys in Python,
    every step; the nested dict it starts from is built in C++ and read here at one key."""
    if device.type == "cuda":
        stats = torch.cuda.memory_stats_as_nested_dict(device)  # {} before CUDA is initialised
        return float(stats.get("allocated_bytes", {}).get("all", {}).get("peak", 0))
    return None


def take_peak_memory(device: torch.device) -> float | None:
    """The peak since the last take (or ``reset_peak_memory``), then start a new one: each
    optimizer step reports its own peak, and an evaluation its own (``val_peak_memory_bytes``),
    instead of a running maximum since ``fit`` started. None off CUDA."""
    peak = peak_memory_bytes(device)
    if peak is not None:
        reset_peak_memory(device)
    return peak


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
