"""Throughput of accumcore's Trainer / Lightning `Trainer(accumulate_grad_batches=N)` and
/ Accelerate's `accumulate()` loop, same model, data, loader, m, N, fp32.

Lightning and Accelerate are never project dependencies: without --quick the script builds
bench/.venv-peers (see bench/harness/peers.py) and re-runs itself there; with --quick it reports
"peer not installed" unless it already runs where they are. Each repeat is one whole `fit`
of one epoch (what a user calls), interleaved across all of them. Target: >= 1.1 on small
models on CPU, >= 1.0 on GPU. The figure uses the same DataLoader for everyone; `accum_fast`
is also shown: accum with its own fast data path (`DeviceBatches`: the dataset held as
tensors, one gather per micro-batch), same samples in the same order, against the peers on
the DataLoader their docs use.

    .venv/bin/python -m bench.trainer.trainer_vs_lightning [--quick] [--out]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from accumcore.device_data import DeviceBatches
from bench.harness import common as _common
from bench.harness import peers as _peers
from bench.harness import workloads as w


def _compare(name: str, model: nn.Module, data, m: int, n_acc: int, repeats: int, device: str,
             peers_ok: bool, warmup: int = 1) -> dict[str, Any]:
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(data, batch_size=m, shuffle=False)
    samples = len(data)

    def make_sgd(params: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)

    models = {key: w.clone(model) for key in ("accum", "accum_fast", "lightning", "accelerate", "tutorial_loop")}
    on_device = DeviceBatches(*data.tensors, m, shuffle=False, device=device)
    runners = {
        "accum": lambda: w.run_trainer(models["accum"], make_sgd(models["accum"].parameters()), loader, n_acc, loss_fn, device),
        "accum_fast": lambda: w.run_trainer(
            models["accum_fast"], make_sgd(models["accum_fast"].parameters()), on_device, n_acc, loss_fn, device
        ),
        "tutorial_loop": lambda: w.tutorial_loop(
            models["tutorial_loop"].to(device), make_sgd(models["tutorial_loop"].parameters()), loader, n_acc, loss_fn, device
        ),
    }
    if peers_ok:
        from bench.harness import peer_runs as _peer_runs

        runners["lightning"] = lambda: _peer_runs.lightning_fit(models["lightning"], make_sgd, loader, n_acc, loss_fn, device)
        runners["accelerate"] = lambda: _peer_runs.accelerate_fit(models["accelerate"], make_sgd, loader, n_acc, loss_fn, device)
    rates = {key: (lambda run=run: samples / _common.timed(run)) for key, run in runners.items()}
    runs = _common.interleaved(rates, repeats, warmup)
    medians = {key: _common.median(values) for key, values in runs.items()}
    # Median of per-round ratios: robust to load drifting during the run.
    ratios = {f"{ours}/{key}": _common.paired_ratio(runs[ours], runs[key])
              for ours in ("accum", "accum_fast") for key in medians if not key.startswith("accum")}
    return {"workload": name, "m": m, "N": n_acc, "samples_per_epoch": samples,
            "samples_per_s": medians, "ratios": ratios, "runs": runs}


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    peers_reason = _peers.reexec_in_peers_env(args.quick)
    _common.configure(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    repeats = args.repeats or (1 if args.quick else 7)
    peers_ok = peers_reason is None
    if args.quick:
        warmup = _common.warmups(args)
        results = [
            _compare("mlp 64-16-16-10", w.mlp(64, 16), w.image_data(32, (1, 8, 8)), 4, 2, repeats, device, peers_ok, warmup),
            _compare("small_cnn 3x8x8", w.small_cnn(width=4), w.image_data(16, (3, 8, 8)), 4, 2, repeats, device, peers_ok, warmup),
        ]
    else:
        results = [
            _compare("mlp 784-256-256-10", w.mlp(), w.image_data(8192), 32, 4, repeats, device, peers_ok),
            _compare("small_cnn 3x32x32", w.small_cnn(), w.image_data(1024, (3, 32, 32)), 32, 4, repeats, device, peers_ok),
        ]
    target = 1.0 if device == "cuda" else 1.1
    measured: dict[str, float | None] = {}
    fast_path: dict[str, float | None] = {}
    for peer in _peers.PEERS:
        values = [r["ratios"][f"accum/{peer}"] for r in results if f"accum/{peer}" in r["ratios"]]
        measured[peer] = min(values) if values else None
        fast = [r["ratios"][f"accum_fast/{peer}"] for r in results if f"accum_fast/{peer}" in r["ratios"]]
        fast_path[peer] = min(fast) if fast else None
    _common.emit("trainer_vs_lightning", {
        "machine": _common.machine(device),
        "figure": "Trainer throughput / peer throughput (worst workload)",
        "target": target,
        "measured": measured,
        "verdict": {peer: _common.verdict(value, target, True) for peer, value in measured.items()},
        "with_accum_fast_data_path": fast_path,
        "peers": _peers.peer_versions(),
        "peers_status": peers_reason or "installed",
        "repeats": repeats, "results": results,
    }, args)


if __name__ == "__main__":
    main()
