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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def memory_events(run: Callable[[], None]) -> list[dict[str, Any]]:
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


def cpu_peak_added(run: Callable[[], None]) -> int:
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
