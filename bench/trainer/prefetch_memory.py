"""Device memory of the fast-path loader does not grow with N: peak(m, N) / peak(m, 1) <= 1.02.

With the fast path on CUDA the batches come from a pinned worker loader; the trainer reads a
window's N batches ahead (to count its items) and they stay on the host; its ``DeviceFeed``
copies each micro-batch to the device just before its forward (on a side stream, while the
GPU finishes the previous backward). Before the fix a ``CudaPrefetcher`` in front of the trainer copied every batch it
yielded, so the whole window (N micro-batches) sat on the device.

No GPU here, so the device is a CPU stand-in: the host batches exist before the measurement
(they are the pinned loader's), a device copy is a clone, and "device-resident" is what the
CPU allocator adds during one epoch (the profiler's memory reporter, accumcore.peak_memory)
plus the live parameters, buffers and optimizer state. Both paths run interleaved, repeated:

- ``feed``: the trainer's feed copies each micro-batch (its copy function is the stand-in's);
- ``prefetcher_before``: a loader that yields device copies one batch ahead (the old path).

    .venv/bin/python -m bench.trainer.prefetch_memory [--quick] [--out DIR]
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from accumcore import Trainer
from accumcore.device_feed import DeviceFeed
from accumcore.peak_memory import cpu_peak_added
from bench.harness import common as _common
from bench.harness import workloads as w

TARGET = 1.02


def _device_copy(batch: Any) -> Any:
    """The stand-in for a host-to-device copy: new memory holding the same values."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    return type(batch)(_device_copy(value) for value in batch)


class CopyingLoader:
    """The old path: yields each batch already on the "device", the next one copied ahead."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        upcoming = _device_copy(self.batches[0]) if self.batches else None
        for index in range(len(self.batches)):
            current = upcoming
            upcoming = _device_copy(self.batches[index + 1]) if index + 1 < len(self.batches) else None
            yield current
            current = None


def _alive_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def peak_bytes(path: str, batches: list[Any], m: int, n_acc: int, width: int) -> int:
    """Peak device-resident bytes of one epoch of ``path`` at micro-batch m, N = n_acc."""
    torch.manual_seed(0)
    model = w.small_cnn(width=width)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=n_acc)
    if path == "feed":
        trainer._runner.feed = DeviceFeed(torch.device("cpu"), copy=_device_copy)
        loader: Any = batches
    else:
        loader = CopyingLoader(batches)
    trainer.fit(loader, epochs=1)  # warm-up: the optimizer state exists from here on
    added = cpu_peak_added(lambda: trainer.fit(loader, epochs=trainer.epoch + 1))
    return _alive_bytes(model, optimizer) + added


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    _common.configure(args)
    m, shape, width, repeats = (8, (3, 16, 16), 8, 2) if args.quick else (16, (3, 32, 32), 16, 2)
    ns = (1, 2, 8) if args.quick else (1, 4, 16)
    data = w.image_data(m * max(ns), shape)
    inputs, targets = data.tensors
    batches = [(inputs[i : i + m].clone(), targets[i : i + m].clone()) for i in range(0, len(inputs), m)]
    paths = ("feed", "prefetcher_before")
    runs: dict[str, dict[int, list[int]]] = {p: {n: [] for n in ns} for p in paths}
    for _ in range(repeats):  # interleaved: every (path, N) once per round
        for n_acc in ns:
            for path in paths:
                runs[path][n_acc].append(peak_bytes(path, batches, m, n_acc, width))
    results = {}
    for path in paths:
        peaks = {n: statistics.median(values) for n, values in runs[path].items()}
        results[path] = {
            "peak_bytes": {str(n): peaks[n] for n in ns},
            "ratio_vs_n1": {str(n): round(peaks[n] / peaks[1], 4) for n in ns},
            "repeats": {str(n): runs[path][n] for n in ns},
        }
    measured = max(results["feed"]["ratio_vs_n1"].values())
    micro_batch_bytes = m * (inputs[0].nbytes + targets[0].nbytes)
    _common.emit("prefetch_memory", {
        "machine": _common.machine("cpu"),
        "measure": "CPU stand-in: allocator peak added during an epoch (profiler) + live "
                   "params/buffers/optimizer state; device copies are clones, host batches pre-exist",
        "workload": f"small_cnn(width={width}) on {shape}, m={m}, N in {list(ns)}, Adam",
        "micro_batch_input_bytes": micro_batch_bytes,
        "figure": "max over N of peak(m,N)/peak(m,1), the trainer's device feed",
        "target": TARGET, "measured": measured, "verdict": _common.verdict(measured, TARGET, False),
        "before_fix_max_ratio": max(results["prefetcher_before"]["ratio_vs_n1"].values()),
        "results": results,
    }, args)


if __name__ == "__main__":
    main()
