"""How good is `micro_batch_size="auto"`? The m it picks / the largest m that truly fits.

`accumcore.auto_batch.find_micro_batch_size` probes divisors of the effective batch B under a
memory cap. The truth is found here independently and exhaustively: for every divisor m of B,
one real training step (Trainer, Adam, N = B/m) is run and its peak memory measured (CUDA max
allocated, or on CPU the profiler's allocator peak plus live state, as in bench/trainer/memory.py);
the largest m whose step peak is within the cap truly fits. On CPU nothing runs out of
memory, so the cap is simulated: several caps are tried and the worst ratio reported.

Targets: m_auto / m_true >= 0.9 (and m_auto <= m_true: a pick that does not fit fails
outright), search time <= 30 training steps at the chosen m.

    .venv/bin/python -m bench.trainer.auto_micro_batch [--quick] [--out]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from accumcore.auto_batch import divisors, find_micro_batch_size, measure_footprint
from accumcore.device_data import DeviceBatches
from accumcore.window_source import reads_window_ahead
from bench.harness import common as _common
from bench.harness import workloads as w
from bench.trainer.memory import peak_bytes


def _step_seconds(model: nn.Module, data, m: int, n_acc: int, device: str, repeats: int) -> float:
    """Median time of one optimizer step (N micro-batches of m) through the Trainer."""
    inputs, targets = data.tensors
    batches = DeviceBatches(inputs[: m * n_acc], targets[: m * n_acc], m, device=device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    runs = [_common.timed(lambda: w.run_trainer(model, optimizer, batches, n_acc, nn.CrossEntropyLoss(), device))
            for _ in range(repeats + 1)]
    return _common.median(runs[1:])


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    _common.configure(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = (3, 8, 8) if args.quick else (3, 32, 32)
    effective = 8 if args.quick else 256
    data = w.image_data(effective, shape)
    candidates = divisors(effective)
    make_model = (lambda: w.small_cnn(width=4)) if args.quick else w.small_cnn

    # Ground truth: the real peak of one training step at every divisor.
    true_peaks = {m: peak_bytes(make_model, data, m, effective // m, "accum", device) for m in candidates}
    # What the auto search believes each m needs (its probe), to explain a wrong pick.
    probe_model = make_model().to(device)
    reads_ahead = reads_window_ahead(DataLoader(data, batch_size=effective))
    believed = {m: measure_footprint(probe_model, lambda k: (data.tensors[0][:k].clone(), data.tensors[1][:k].clone()), m,
                                     device, optimizer=torch.optim.Adam, accumulation_steps=effective // m,
                                     read_ahead=reads_ahead)
                for m in candidates}
    # Caps between the peaks of consecutive divisors, so every cap has a unique true answer.
    caps = [int((true_peaks[a] + true_peaks[b]) / 2) for a, b in zip(candidates[1:], candidates[2:], strict=False)]
    caps = caps[-3:] if not args.quick else caps[-1:]

    rows: list[dict[str, Any]] = []
    for cap in caps:
        truth = max(m for m in candidates if true_peaks[m] <= cap)
        torch.manual_seed(0)
        model = make_model().to(device)
        chosen = 0

        def search(cap: int = cap, model: nn.Module = model) -> None:
            nonlocal chosen
            chosen = find_micro_batch_size(
                model, lambda k: (data.tensors[0][:k].clone(), data.tensors[1][:k].clone()), effective, device,
                memory_limit_bytes=cap, optimizer=torch.optim.Adam,
                read_ahead=reads_window_ahead(DataLoader(data, batch_size=effective)),
            )

        search_s = _common.timed(search)  # the same clock as the training steps it is compared to
        step_s = _step_seconds(model, data, chosen, effective // chosen, device, 1 if args.quick else 3)
        rows.append({
            "cap_bytes": cap, "m_auto": chosen, "m_true": truth, "ratio": chosen / truth,
            "fits": chosen <= truth, "search_s": search_s, "step_s": step_s,
            "search_in_steps": search_s / step_s,
        })
    fits_all = all(r["fits"] for r in rows)
    # A pick above the truth is worse than any pick below it: it runs out of memory.
    worst = min(r["ratio"] for r in rows) if fits_all else max(r["ratio"] for r in rows if not r["fits"])
    verdict = _common.verdict(worst, 0.9, True) if fits_all else "miss: picks an m that does not fit"
    cost = max(r["search_in_steps"] for r in rows)
    _common.emit("auto_micro_batch", {
        "machine": _common.machine(device),
        "figure": "m chosen by auto / largest m that truly fits (worst cap); search cost in steps",
        "target": 0.9, "measured": worst, "verdict": verdict,
        "cost_target_steps": 30, "cost_steps": cost, "cost_verdict": _common.verdict(cost, 30, False),
        "effective_batch": effective, "workload": f"small_cnn {'x'.join(map(str, shape))}, Adam",
        "trainer_reads_ahead": reads_ahead,
        "true_peak_bytes": {str(m): p for m, p in true_peaks.items()},
        "probe_footprint_bytes": {str(m): b for m, b in believed.items()},
        "results": rows,
    }, args)


if __name__ == "__main__":
    main()
