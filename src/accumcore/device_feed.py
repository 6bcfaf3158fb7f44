"""Each micro-batch's inputs go to the device just before its forward.

Rule 2 of docs/accumulation.md makes the trainer read a window's N batches before its first
backward. Those batches stay where the loader made them (on the host, pinned with the fast
path); only the micro-batch about to run is on the device, copied on a side stream on CUDA
while the GPU finishes the previous micro-batch's backward. So device memory does not grow
with N, the promise of accumulation (bench/prefetch_memory.py: peak(m, N) / peak(m, 1)).

A loader that copies every batch it yields to the device (``fast_path.CudaPrefetcher``) would
put the whole window there while it is read; the trainer iterates the loader it wraps
instead (``fast_path.host_loader``), and this feed does the overlap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch

from accumcore import items


class Loadable(Protocol):
    def load(self) -> tuple[Any, Any]: ...


Copy = Callable[[Any], Any]


class DeviceFeed:
    """Yields ``(host inputs, device inputs, device targets)`` for a window's micro-batches.

    Micro-batch i+1 is copied when the caller asks for it, that is once micro-batch i's
    backward is queued: on CUDA on a side stream, so the copy runs while the GPU still works
    through that backward (the CPU is ahead of the GPU), and the compute stream waits for it
    before the next forward. The copy is not issued earlier on purpose: during micro-batch
    i's forward, the peak of a step's memory, only micro-batch i's inputs are on the device,
    whatever N is (a copy issued before that forward would add a micro-batch to the peak).

    Args:
        device: where the model runs.
        copy: moves one (inputs, targets) pair to the device; default ``items.to_device``
            (non-blocking). A CPU stand-in passes a copy that counts device-resident bytes.
    """

    def __init__(self, device: torch.device, copy: Copy | None = None) -> None:
        self.device = device
        self.copy: Copy = copy or (on_host if device.type == "cpu" else (
            lambda pair: (items.to_device(pair[0], device), items.to_device(pair[1], device))))
        self.side_stream = device.type == "cuda" and torch.cuda.is_available()
        self._stream: Any = None  # created on first use: creating it initialises CUDA

    def window(self, micro_batches: Sequence[Loadable]) -> Iterator[tuple[Any, Any, Any]]:
        """The window's micro-batches on the device, one at a time. The caller drops its
        references to a yielded micro-batch before asking for the next."""
        for mb in micro_batches:
            host, targets = mb.load()
            if not self.side_stream:
                inputs, targets = self.copy((host, targets))
            else:
                if self._stream is None:
                    self._stream = torch.cuda.Stream(device=self.device)
                with torch.cuda.stream(self._stream):
                    inputs, targets = self.copy((host, targets))
                compute = torch.cuda.current_stream(self.device)
                compute.wait_stream(self._stream)
                record_stream((inputs, targets), compute)  # the allocator must not reuse it early
            yield host, inputs, targets
            host = inputs = targets = None  # the caller's are the only references left


def on_host(pair: Any) -> Any:
    """The CPU's copy: a pair of host tensors as it is (what ``Tensor.to("cpu")`` returns for
    each: ~2 us a micro-batch saved); anything else through ``items.to_device``."""
    inputs, targets = pair
    if isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor) and inputs.is_cpu and targets.is_cpu:
        return pair
    cpu = torch.device("cpu")
    return items.to_device(inputs, cpu), items.to_device(targets, cpu)


def record_stream(batch: Any, stream: Any) -> None:
    """Tell the caching allocator the tensors are used on ``stream`` (so it will not reuse
    their blocks while that stream still reads them)."""
    if isinstance(batch, torch.Tensor):
        if batch.device.type == "cuda":
            batch.record_stream(stream)
    elif isinstance(batch, tuple | list):
        for item in batch:
            record_stream(item, stream)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            record_stream(value, stream)
