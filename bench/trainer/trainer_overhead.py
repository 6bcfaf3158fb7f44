"""Overhead of accumcore's Trainer.fit against the hand-written tutorial accumulation loop.

    .venv/bin/python -m bench.trainer.trainer_overhead [--quick] [--repeats 21] [--processes 9] [--threads 1] [--out]

Prints one JSON object:
Two workloads: a small CNN (the service's image jobs) and an MLP, where the per-step pass
over all gradients for the ``grad_norm`` metric weighs most against the compute.

- ``throughput_ratio``: samples/s of ``Trainer.fit`` / samples/s of the tutorial loop (same
  model, data, loader, m, N, fp32, SGD; the loop does no ``.item()`` at all, so it is the
  fastest baseline). Medians over interleaved repeats after warm-up (the sides' order rotating
  each round), in each of ``--processes`` fresh processes (9: one process alone read
  0.90-1.16 here), and the median over those.
  Target >= 0.99.
- ``throughput_ratio_without_grad_norm``: the same with ``Trainer(grad_norm=False)``, which
  skips the per-step pass over all gradients for the ``grad_norm`` metric that the loop does
  not compute either: the Trainer doing the loop's work, plus exact item weighting.
- ``memory_ratio``: peak memory with (m, N) / with (m, 1), same m. CUDA: max allocated.
  CPU: the process's RSS high-water mark (VmHWM), measured in a fresh subprocess per config;
  the peak is reset just before fit (/proc/self/clear_refs), and the growth over the RSS
  before fit is reported too. Target <= 1.02.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from accumcore import Trainer
from accumcore.data import make_loader
from bench.harness import common as _common
from bench.harness import workloads as w

BENCH = "trainer_overhead"


# name -> (description, micro-batch m, N, samples per epoch)
WORKLOADS = {
    "cnn": ("conv 3-16-32 on 3x16x16 images, 10 classes", 32, 4, 1024),
    "mlp": ("mlp 256-512-512-10", 64, 4, 2048),
}


def build(workload: str, samples: int, seed: int = 0) -> tuple[nn.Module, TensorDataset]:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    targets = torch.randint(0, 10, (samples,), generator=g)
    if workload == "cnn":
        model: nn.Module = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
        )
        return model, TensorDataset(torch.randn(samples, 3, 16, 16, generator=g), targets)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return model, TensorDataset(torch.randn(samples, 256, generator=g), targets)


def tutorial_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, loader, n_acc: int, device: torch.device) -> None:
    """The recipe of the PyTorch/HF tutorials: loss / N, step every N micro-batches (and the short last window)."""
    w.tutorial_loop(model, optimizer, loader, n_acc, nn.CrossEntropyLoss(), device, flush_last=True)


def trainer_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, loader, n_acc: int, device: torch.device) -> None:
    w.run_trainer(model, optimizer, loader, n_acc, nn.CrossEntropyLoss(), device)


def trainer_epoch_without_grad_norm(model: nn.Module, optimizer: torch.optim.Optimizer, loader, n_acc: int,
                                    device: torch.device) -> None:
    w.run_trainer(model, optimizer, loader, n_acc, nn.CrossEntropyLoss(), device, grad_norm=False)


def throughput(args: Any, workload: str, device: torch.device) -> dict[str, Any]:
    _, m, n_acc, samples = WORKLOADS[workload]
    samples = min(samples, 256) if args.quick else samples
    model_a, data = build(workload, samples)
    model_b, _ = build(workload, samples)
    model_c, _ = build(workload, samples)
    for model in (model_a, model_b, model_c):
        model.to(device)
    opt_a = torch.optim.SGD(model_a.parameters(), lr=1e-3, momentum=0.9)
    opt_b = torch.optim.SGD(model_b.parameters(), lr=1e-3, momentum=0.9)
    opt_c = torch.optim.SGD(model_c.parameters(), lr=1e-3, momentum=0.9)
    loader = make_loader(data, m, seed=0)
    sides = (("trainer", trainer_epoch, model_a, opt_a), ("loop", tutorial_epoch, model_b, opt_b),
             ("trainer_without_grad_norm", trainer_epoch_without_grad_norm, model_c, opt_c))

    cpu_seconds: dict[str, list[float]] = {name: [] for name, *_ in sides}

    def rate(fn, model, optimizer) -> tuple[float, float]:
        sync()
        start, cpu_start = time.perf_counter(), time.process_time()
        fn(model, optimizer, loader, n_acc, device)
        sync()
        return samples / (time.perf_counter() - start), time.process_time() - cpu_start

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    repeats = 3 if args.quick else args.repeats
    rates: dict[str, list[float]] = {name: [] for name, *_ in sides}
    # Interleaved (trainer, loop, lean trainer, then loop, lean trainer, trainer, ...): a burst
    # of load from another process on a shared machine then hits every side of a ratio, not
    # one, and the order rotates each round, so that no side always runs first (or always
    # right after the same other side, with what that one left in the caches).
    for index in range(repeats + 2):
        for name, fn, model, optimizer in sides[index % len(sides):] + sides[:index % len(sides)]:
            value, cpu = rate(fn, model, optimizer)
            if index >= 2:  # two warm-up rounds
                rates[name].append(value)
                cpu_seconds[name].append(cpu)
    trainer_rate, loop_rate = statistics.median(rates["trainer"]), statistics.median(rates["loop"])
    # Per-repeat ratios of the interleaved pairs show the noise of a shared machine.
    pair_ratios = sorted(a / b for a, b in zip(rates["trainer"], rates["loop"], strict=True))
    return {
        "trainer_samples_per_s": trainer_rate,
        "loop_samples_per_s": loop_rate,
        "throughput_ratio": trainer_rate / loop_rate,
        "throughput_ratio_without_grad_norm": statistics.median(rates["trainer_without_grad_norm"]) / loop_rate,
        # Best-of-repeats: the least disturbed run of each side, for a machine shared with others.
        "throughput_ratio_best": max(rates["trainer"]) / max(rates["loop"]),
        # CPU seconds of the process per epoch, loop / trainer: less sensitive than wall time
        # to other processes on a shared machine (meaningful with --threads 1 on CPU).
        "cpu_time_ratio": statistics.median(cpu_seconds["loop"]) / statistics.median(cpu_seconds["trainer"]),
        "pair_ratio_quartiles": [pair_ratios[len(pair_ratios) // 4], statistics.median(pair_ratios),
                                 pair_ratios[(3 * len(pair_ratios)) // 4]],
        "repeats": repeats,
        "samples_per_epoch": samples,
    }


def throughput_in_processes(args: Any, workload: str, device: torch.device) -> dict[str, Any]:
    """``throughput`` in ``args.processes`` fresh processes, one after the other: each
    process's allocator and caches take a course of their own (on this VM one process's
    median ratio moved by 5 % from the next's), so the row is the median over processes."""
    if args.processes <= 1:
        return throughput(args, workload, device)
    runs = [probe(args, workload, device, "--throughput-probe", "--repeats", str(args.repeats))
            for _ in range(args.processes)]
    row = {key: statistics.median(run[key] for run in runs)
           for key in ("trainer_samples_per_s", "loop_samples_per_s", "throughput_ratio",
                       "throughput_ratio_without_grad_norm", "throughput_ratio_best", "cpu_time_ratio")}
    row["throughput_ratio_per_process"] = [round(run["throughput_ratio"], 4) for run in runs]
    row["throughput_ratio_without_grad_norm_per_process"] = [
        round(run["throughput_ratio_without_grad_norm"], 4) for run in runs]
    row.update(processes=args.processes, repeats=args.repeats, samples_per_epoch=runs[0]["samples_per_epoch"])
    return row


def probe(args: Any, workload: str, device: torch.device, *flags: str) -> dict[str, Any]:
    """This bench with ``flags`` (a hidden probe option) in a fresh process: its JSON line."""
    command = [sys.executable, "-m", __spec__.name, *flags, "--workloads", workload, "--device", str(device)] + (
        ["--quick"] if args.quick else []) + (["--threads", str(args.threads)] if args.threads else [])
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=_common.ROOT).stdout
    return dict(json.loads(out))


def _read_status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} missing from /proc/self/status")


def memory_probe(args: Any, workload: str, n_acc: int, device: torch.device) -> dict[str, float]:
    """One config, in this (fresh) process: peak bytes of one epoch of Trainer.fit."""
    _, m, _, samples = WORKLOADS[workload]
    samples = min(samples, 256) if args.quick else samples
    model, data = build(workload, samples)
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loader = make_loader(data, m, seed=0)
    trainer = Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=n_acc, device=device)
    trainer.fit(loader, epochs=1)  # warm-up: allocator pools, optimizer state
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        trainer.fit(loader, epochs=2)
        torch.cuda.synchronize(device)
        return {"peak_bytes": float(torch.cuda.max_memory_allocated(device)), "before_bytes": float(before)}
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _read_status("VmRSS")
    trainer.fit(loader, epochs=2)
    return {"peak_bytes": float(_read_status("VmHWM")), "before_bytes": float(before)}


def memory(args: Any, workload: str, device: torch.device) -> dict[str, Any]:
    peaks = {label: probe(args, workload, device, "--memory-probe", str(n_acc))
             for label, n_acc in (("m_N", WORKLOADS[workload][2]), ("m_1", 1))}
    kind = "cuda_max_allocated" if device.type == "cuda" else "cpu_rss_high_water"
    growth = {k: v["peak_bytes"] - v["before_bytes"] for k, v in peaks.items()}
    return {
        "memory_measure": kind,
        "peak_bytes_m_N": peaks["m_N"]["peak_bytes"],
        "peak_bytes_m_1": peaks["m_1"]["peak_bytes"],
        "memory_ratio": peaks["m_N"]["peak_bytes"] / peaks["m_1"]["peak_bytes"],
        "growth_during_fit_bytes_m_N": growth["m_N"],
        "growth_during_fit_bytes_m_1": growth["m_1"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    parser.add_argument("--repeats", type=int, default=21, help="timed repeats per side (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--out", nargs="?", const=str(_common.RESULTS_DIR),
                        default=None, help="also append the JSON to OUT/trainer_overhead.jsonl")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--processes", type=int, default=9,
                        help="fresh processes measuring the throughput, one after another (median)")
    parser.add_argument("--memory-probe", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--throughput-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    if args.memory_probe is not None:
        print(json.dumps(memory_probe(args, workloads[0], args.memory_probe, device)))
        return
    if args.throughput_probe:
        print(json.dumps(throughput(args, workloads[0], device)))
        return
    if args.quick:
        args.processes = 1
    started = time.perf_counter()
    result: dict[str, Any] = {
        "machine": _common.machine(str(device)),
        "common": {"precision": "fp32", "optimizer": "SGD(lr=1e-3, momentum=0.9)",
                   "loader": "accumcore.data.make_loader", "trainer": "defaults (grad_norm computed every step); "
                   "throughput_ratio_without_grad_norm: Trainer(grad_norm=False)"},
        "workloads": {},
    }
    for workload in workloads:
        description, m, n_acc, samples = WORKLOADS[workload]
        row: dict[str, Any] = {"model": description, "m": m, "N": n_acc}
        row.update(throughput_in_processes(args, workload, device))
        row.update(memory(args, workload, device))
        row["targets"] = {
            "throughput_ratio >= 0.99": verdict(row["throughput_ratio"] >= 0.99),
            "memory_ratio <= 1.02": verdict(row["memory_ratio"] <= 1.02),
        }
        result["workloads"][workload] = row
    result["wall_s"] = time.perf_counter() - started
    row = {"bench": BENCH, "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "quick": args.quick, **result}
    text = json.dumps(row, default=float)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with (Path(args.out) / f"{BENCH}.jsonl").open("a") as handle:
            handle.write(text + "\n")


def verdict(ok: bool) -> str:
    return "pass" if ok else "miss"


if __name__ == "__main__":
    main()
