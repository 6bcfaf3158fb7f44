"""Automatic micro-batch size: the largest m that divides the effective batch B and fits.

Rule 11 of ACCUMULATION.md: m must divide B so that m x N == B exactly (no floor division
that silently shrinks the effective batch). Memory grows with m, so the divisors of B are
binary-searched, each probe being one forward+backward on ``sample_batch_fn(m)``:

    m = find_micro_batch_size(model, lambda m: (torch.randn(m, 3, 32, 32), torch.zeros(m, dtype=torch.long)),
                              effective_batch_size=256, device="cuda")
    n = accumulation_for(256, m)

On CUDA a probe fails on a real out-of-memory error (or above ``memory_limit_bytes``). On the
CPU, where nothing runs out, ``memory_limit_bytes`` is compared with the probe's footprint
(parameters, gradients, and the tensors autograd saves for backward), which lets tests and
capacity planning inject a limit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accumcore import distributed, items
from accumcore.oom import OOM_ERRORS, release_memory
from accumcore.precision import Precision


def divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def accumulation_for(effective_batch_size: int, micro_batch_size: int) -> int:
    """N such that m x N == B, or a clear error when m does not divide B."""
    if micro_batch_size < 1 or effective_batch_size % micro_batch_size:
        raise ValueError(
            f"micro_batch_size {micro_batch_size} does not divide effective_batch_size "
            f"{effective_batch_size}; pick one of {divisors(effective_batch_size)} or 'auto'"
        )
    return effective_batch_size // micro_batch_size


def find_micro_batch_size(
    model: torch.nn.Module,
    sample_batch_fn: Callable[[int], Any],
    effective_batch_size: int,
    device: str | torch.device = "cpu",
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    precision: str = "fp32",
    memory_limit_bytes: int | None = None,
    max_micro_batch_size: int | None = None,
) -> int:
    """The largest divisor m of ``effective_batch_size`` whose forward+backward fits.

    Args:
        model: the model to probe (gradients and buffers are restored afterwards).
        sample_batch_fn: ``fn(m) -> (inputs, targets)``, a representative batch of m samples.
        effective_batch_size: B, samples per optimizer step (per rank).
        device: where to probe.
        loss_fn: defaults to cross-entropy.
        precision: as in ``Trainer``; autocast changes the memory a probe needs.
        memory_limit_bytes: treat a probe above this footprint as out of memory.
        max_micro_batch_size: never return more than this.

    Raises:
        RuntimeError: when even m=1 does not fit.
    """
    if effective_batch_size < 1:
        raise ValueError(f"effective_batch_size must be >= 1, got {effective_batch_size}")
    device = torch.device(device)
    loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
    # Probe the bare module: DDP would all-reduce every probe's gradients, and ranks probing
    # different sizes would wait on each other forever.
    model = distributed.unwrap(model)
    candidates = [
        d for d in divisors(effective_batch_size)
        if max_micro_batch_size is None or d <= max_micro_batch_size
    ]
    was_training = model.training
    model.train()
    best = None
    low, high = 0, len(candidates) - 1
    try:
        while low <= high:
            middle = (low + high) // 2
            if _fits(model, sample_batch_fn, candidates[middle], device, loss_fn, precision, memory_limit_bytes):
                best = candidates[middle]
                low = middle + 1
            else:
                high = middle - 1
    finally:
        model.train(was_training)
    if best is None:
        raise RuntimeError(
            "not even a micro-batch of 1 sample fits on "
            f"{device}{f' within {memory_limit_bytes} bytes' if memory_limit_bytes else ''}; "
            "use precision='bf16' or 'fp16', a smaller model, or a larger device"
        )
    return best


def _fits(
    model: torch.nn.Module,
    sample_batch_fn: Callable[[int], Any],
    size: int,
    device: torch.device,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    precision: str,
    limit: int | None,
) -> bool:
    used = measure_footprint(model, sample_batch_fn, size, device, loss_fn=loss_fn, precision=precision)
    return used is not None and (limit is None or used <= limit)


def measure_footprint(
    model: torch.nn.Module,
    sample_batch_fn: Callable[[int], Any],
    size: int,
    device: str | torch.device = "cpu",
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    precision: str = "fp32",
) -> int | None:
    """Bytes one forward+backward of ``size`` samples needs; None when it ran out of memory.

    CUDA: the peak allocated memory. CPU: parameters, gradients and saved activations.
    Gradients are cleared and buffers (BatchNorm statistics) restored afterwards.
    """
    device = torch.device(device)
    loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
    inputs, targets = items.unpack(sample_batch_fn(size))
    inputs, targets = items.to_device(inputs, device), items.to_device(targets, device)
    footprint = _Footprint()
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    used: int | None = None
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with (
            torch.autograd.graph.saved_tensors_hooks(footprint.pack, footprint.unpack),
            Precision(precision, device).autocast(),
        ):
            loss = loss_fn(model(inputs), targets)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            used = int(torch.cuda.max_memory_allocated(device))
        else:
            used = footprint.saved + sum(
                p.numel() * p.element_size() * (2 if p.grad is not None else 1) for p in model.parameters()
            )
    except OOM_ERRORS:
        used = None
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)  # a probe must not move BatchNorm statistics
    if used is None:
        release_memory()
    return used


class _Footprint:
    """Sums the bytes of distinct storages autograd saves for backward."""

    def __init__(self) -> None:
        self.saved = 0
        self._seen: set[int] = set()

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._seen:
            self._seen.add(storage.data_ptr())
            self.saved += storage.nbytes()
        return tensor

    def unpack(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor
