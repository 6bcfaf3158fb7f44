"""Peak memory of a piece of work, measured the way the memory benchmarks judge it.

CUDA: ``torch.cuda.max_memory_allocated`` after a reset. CPU has no allocator peak counter,
so the profiler's CPU memory reporter (``profile_memory=True``) is used: every allocation
and free inside the profiled call carries the allocator's running total, and its maximum
above the total at the start is the peak the call added (``bench/trainer/memory.py`` measures the
same way). Not RSS, which the C library's caching blurs.
"""

from __future__ import annotations

import json
import os
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from accumcore import items


def memory_events(run: Callable[[], object]) -> list[dict[str, Any]]:
    """The profiler's ``[memory]`` events recorded while ``run`` executes, in time order.

    Each event's ``args`` carry ``Bytes`` (this allocation, negative for a free),
    ``Total Allocated`` (the allocator's running total after it) and ``Device Type``.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    handle, path = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    try:
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    finally:
        os.unlink(path)
    return sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e.get("ts", 0))


def cuda_fit_peak(steps: Sequence[Mapping[str, Any]], device: torch.device | str) -> int:
    """The CUDA allocator's peak over a ``Trainer.fit`` whose ``history.steps`` are ``steps``
    (the counter reset before it, read after it). The trainer takes and resets that counter
    at every optimizer step (its ``peak_memory_bytes`` metric), so afterwards it holds only
    what came after the last step: the fit's peak is the largest of those."""
    return int(max([torch.cuda.max_memory_allocated(device)]
                   + [step.get("peak_memory_bytes", 0) for step in steps]))


def cpu_peak_added(run: Callable[[], object]) -> int:
    """Bytes the CPU allocator held at most above its level when ``run`` started.

    Free what ``run`` allocates inside it: the reporter's running total only forgets blocks
    freed while profiling, so a block freed later would count against the next measurement.
    """
    memory = [e for e in memory_events(run) if e.get("args", {}).get("Device Type", 0) == 0]
    if not memory:
        return 0  # nothing was allocated on the CPU
    first = memory[0]["args"]
    start = int(first.get("Total Allocated", 0)) - int(first.get("Bytes", 0))
    return max(0, max(int(e["args"].get("Total Allocated", 0)) for e in memory) - start)


def tensor_bytes(tensors: object) -> int:
    """Bytes of the distinct storages among ``tensors`` (nested lists, tuples, dicts)."""
    seen: dict[int, int] = {}

    def visit(value: object) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, list | tuple):
            for item in value:
                visit(item)

    visit(tensors)
    return sum(seen.values())


class ResidentBytes:
    """A CPU stand-in for device memory: the bytes of the copies ``copy`` made that are alive.

    Pass ``copy`` as ``DeviceFeed(copy=...)`` (or as any loader's device copy): each tensor it
    copies is cloned, and counted until the clone is freed, so ``peak`` is the most bytes the
    trainer held "on the device" at once, and ``samples`` the samples among them now.
    """

    def __init__(self) -> None:
        self.bytes = 0
        self.peak = 0
        self.samples = 0
        self.peak_samples = 0

    def copy(self, batch: Any) -> Any:
        """Clone ``batch`` (tensors in nested tuples, lists, dicts); an (inputs, targets) pair
        also counts its rows as samples while its inputs are alive."""
        copied = self._clone(batch)
        if isinstance(copied, tuple | list) and len(copied) == 2:
            first = items.first_dim(copied[0]) if copied[0] is not None else 0
            anchor = next(_tensors(copied[0]), None)
            if first and anchor is not None:
                self._add(0, first)
                weakref.finalize(anchor, self._add, 0, -first)
        return copied

    def _clone(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            clone = value.clone()
            self._add(clone.nbytes, 0)
            weakref.finalize(clone, self._add, -clone.nbytes, 0)
            return clone
        if isinstance(value, dict):
            return {key: self._clone(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self._clone(item) for item in value)
        return value

    def _add(self, nbytes: int, samples: int) -> None:
        self.bytes += nbytes
        self.samples += samples
        self.peak = max(self.peak, self.bytes)
        self.peak_samples = max(self.peak_samples, self.samples)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
