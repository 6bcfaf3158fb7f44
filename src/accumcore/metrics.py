"""Per-step metrics, gathered with a single device sync per optimizer step."""

from __future__ import annotations

from typing import Any

import torch


def to_floats(values: list[Any]) -> list[Any]:
    """Python numbers and 0-d tensors as floats (None stays None), in one pass: one device
    sync for all the tensors on a device, none for those on the host (floats or None: Any,
    so that callers unpack them without a cast each)."""
    result: list[Any] = []
    on_device: list[int] = []
    for value in values:
        if isinstance(value, torch.Tensor) and not value.is_cpu:
            on_device.append(len(result))
            result.append(value)
        else:
            result.append(None if value is None else float(value))
    if on_device:
        device = result[on_device[0]].device
        stacked = torch.stack(
            [result[i].detach().to(device=device, dtype=torch.float64).reshape(()) for i in on_device]
        )
        for index, number in zip(on_device, stacked.tolist(), strict=True):
            result[index] = number
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


def rank_peaks(peak: float, device: torch.device) -> dict[str, float]:
    """Every rank's step peak as ``peak_memory_bytes_rank{r}`` (a collective on every rank: all
    of a world share a device type, so all of them have a peak or none has); ``{}`` in one
    process. Sharded ranks hold different shards: their peaks differ where DDP's match."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return {}
    mine = torch.tensor([peak], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return {f"peak_memory_bytes_rank{r}": float(value) for r, value in enumerate(every)}


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
