"""What accumulation costs in speed: samples/s at (m, N) / samples/s at (m x N, 1).

Both through accumcore's Trainer, same model and samples; the data are held in memory by
`accumcore.device_data.DeviceBatches` so the loader does not hide the cost. Swept over m: the
target (>= 0.95) applies once m fills the device, i.e. at the largest m measured here.

    .venv/bin/python -m bench.trainer.accumulation_cost [--quick] [--out]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from accumcore.device_data import DeviceBatches
from bench.harness import common as _common
from bench.harness import workloads as w


def _rate(model: nn.Module, data, m: int, n_acc: int, device: str) -> float:
    inputs, targets = data.tensors
    batches = DeviceBatches(inputs, targets, m, seed=0, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    seconds = _common.timed(lambda: w.run_trainer(model, optimizer, batches, n_acc, nn.CrossEntropyLoss(), device))
    return len(inputs) / seconds


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    _common.configure(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n_acc = 4
    gpu = device == "cuda"
    # m "fills the device" much later on a GPU than on a CPU core.
    sizes = [2, 4] if args.quick else ([64, 256, 1024] if gpu else [4, 16, 64])
    samples = 32 if args.quick else (16384 if gpu else 1024)
    repeats = args.repeats or (1 if args.quick else 5)
    data = w.image_data(samples, (3, 8, 8) if args.quick else (3, 32, 32))
    torch.manual_seed(0)
    base = w.small_cnn(width=4) if args.quick else w.small_cnn()
    rows: list[dict[str, Any]] = []
    for m in sizes:
        accumulated, big = w.clone(base).to(device), w.clone(base).to(device)
        runs = _common.interleaved({
            "accumulated": lambda a=accumulated, m=m: _rate(a, data, m, n_acc, device),
            "big_batch": lambda b=big, m=m: _rate(b, data, m * n_acc, 1, device),
        }, repeats, _common.warmups(args))
        rate_acc, rate_big = _common.median(runs["accumulated"]), _common.median(runs["big_batch"])
        rows.append({"m": m, "N": n_acc, "samples_per_s_m_N": rate_acc, "samples_per_s_mN_1": rate_big,
                     "ratio": _common.paired_ratio(runs["accumulated"], runs["big_batch"]), "runs": runs})
    measured = rows[-1]["ratio"]
    _common.emit("accumulation_cost", {
        "machine": _common.machine(device),
        "figure": "samples/s at (m,N) / at (mN,1), largest m (small_cnn, N=4)",
        "target": 0.95, "measured": measured, "verdict": _common.verdict(measured, 0.95, True),
        "repeats": repeats, "samples_per_epoch": samples, "results": rows,
    }, args)


if __name__ == "__main__":
    main()
