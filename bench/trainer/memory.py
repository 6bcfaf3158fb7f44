"""Peak memory of a training step: accumulation must cost (almost) nothing, and must beat the
big batch it replaces.

    peak(m, N) / peak(m, 1)      target <= 1.02
    peak(m, N) / peak(m x N, 1)  should be far below 1 (the point of accumulating)

Measured for accumcore's Trainer and, for reference, the tutorial loop, on the same data.
On CUDA: `torch.cuda.max_memory_allocated`. On CPU there is no allocator counter, so we use
the profiler's CPU memory reporter (`profile_memory=True`): every allocation and free made by
the profiled step carries the running "Total Allocated"; its maximum is the peak the step
added, to which we add what was alive before it (parameters, buffers, optimizer state).
That is the CPU analogue of CUDA max allocated (not RSS, which glibc caching blurs).

    .venv/bin/python -m bench.trainer.memory [--quick] [--out]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from accumcore import Trainer
from accumcore.peak_memory import cuda_fit_peak, memory_events
from accumcore.window_source import reads_window_ahead
from bench.harness import common as _common
from bench.harness import workloads as w


def _alive_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _profiled_peak(run: Callable[[], None]) -> int:
    """Max of the CPU allocator's running total while `run` executes (bytes)."""
    totals = [e["args"].get("Total Allocated", 0) for e in memory_events(run)]
    if not totals:
        raise RuntimeError("the profiler recorded no CPU memory events; cannot measure the peak")
    return int(max(totals))


def peak_bytes(make_model: Callable[[], nn.Module], data, m: int, n_acc: int, method: str, device: str) -> int:
    torch.manual_seed(0)
    model = make_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=m, shuffle=False)
    loss_fn = nn.CrossEntropyLoss()

    def run() -> None:
        if method == "accum":
            w.run_trainer(model, optimizer, loader, n_acc, loss_fn, device)
        else:
            w.tutorial_loop(model, optimizer, loader, n_acc, loss_fn, device)

    run()  # warm-up: optimizer state exists from here on, as in a long run
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        if method == "accum":  # the trainer resets the counter at each step: cuda_fit_peak
            trainer = Trainer(model, optimizer, loss_fn=loss_fn, accumulation_steps=n_acc, device=device)
            steps = trainer.fit(loader, epochs=1).steps
            torch.cuda.synchronize()
            return cuda_fit_peak(steps, device)
        run()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    return _alive_bytes(model, optimizer) + _profiled_peak(run)


def _workload(name: str, make_model: Callable[[], nn.Module], shape: tuple[int, ...], m: int, n_acc: int,
              device: str) -> dict[str, Any]:
    data = w.image_data(m * n_acc, shape)
    rows: dict[str, Any] = {}
    for method in ("accum", "tutorial_loop"):
        peaks = {
            "m_N": peak_bytes(make_model, data, m, n_acc, method, device),
            "m_1": peak_bytes(make_model, data, m, 1, method, device),
            "mN_1": peak_bytes(make_model, data, m * n_acc, 1, method, device),
        }
        rows[method] = {
            "peak_bytes": peaks,
            "accumulation_vs_micro_batch": peaks["m_N"] / peaks["m_1"],
            "accumulation_vs_big_batch": peaks["m_N"] / peaks["mN_1"],
        }
    params = sum(p.numel() for p in make_model().parameters())
    inputs, targets = data.tensors
    # The trainer must know a window's item count before its first backward. Where it cannot
    # count it from the targets alone (accumcore.window_source), it reads the window's N
    # micro-batches ahead: N - 1 loaded micro-batches more than the loop holds.
    reads_ahead = reads_window_ahead(DataLoader(data, batch_size=m, shuffle=False))
    read_ahead = (n_acc - 1) * m * (inputs[0].nbytes + targets[0].nbytes) if reads_ahead else 0
    return {"workload": name, "m": m, "N": n_acc, "parameters": params,
            "trainer_reads_ahead": reads_ahead, "read_ahead_bytes": read_ahead, **rows}


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    _common.configure(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    m, n_acc = (4, 2) if args.quick else (64, 4)
    if args.quick:
        conv = _workload("small_cnn 3x8x8", lambda: w.small_cnn(width=4), (3, 8, 8), m, n_acc, device)
        dense = _workload("mlp 64-16-16-10", lambda: w.mlp(64, 16), (1, 8, 8), m, n_acc, device)
    else:
        conv = _workload("small_cnn 3x32x32 (activations dominate)", w.small_cnn, (3, 32, 32), m, n_acc, device)
        dense = _workload("mlp 784-256-256-10 (weights dominate)", w.mlp, (1, 28, 28), m, n_acc, device)
    measured = conv["accum"]["accumulation_vs_micro_batch"]
    _common.emit("memory", {
        "machine": _common.machine(device),
        "measure": "cuda max_memory_allocated" if device == "cuda" else
                   "CPU profiler memory reporter peak + live params/buffers/optimizer state",
        "figure": "peak(m,N)/peak(m,1) (accum, conv workload); peak(m,N)/peak(mN,1) reported",
        "target": 1.02, "measured": measured, "verdict": _common.verdict(measured, 1.02, False),
        "big_batch_ratio": conv["accum"]["accumulation_vs_big_batch"],
        "results": [conv, dense],
    }, args)


if __name__ == "__main__":
    main()
