"""The Trainer's per-fit set-up cost: Trainer() + fit(max_steps=k) / a hand loop of k steps.

For k = 1, 2 and 64 optimizer steps (m=32, N=4, fp32, SGD momentum) on the mlp and small_cnn
workloads, a fresh Trainer per timed run (as the throughput benches build one per epoch)
against the tutorial loop stopped after the same k steps, same loader; interleaved rounds,
CUDA synchronised around each run. The constant part (intercept of the extra time over k) is
the per-fit cost; the slope is the per-step cost. k = 0 is the Trainer's construction alone
(``fit`` refuses max_steps=0). Then one 1-step fit is profiled: cProfile (host functions by
own time) and torch.profiler (CUDA runtime calls: device/stream syncs, memcpy, by count).

    python -m bench.trainer.fit_setup [--quick] [--out [DIR]] [--repeats K]

The per-k timings and the profiles' top 25 rows go to stderr; stdout is the one JSON row.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from typing import Any

import torch
from torch import nn

from accumcore import Trainer
from accumcore.data import make_loader
from bench.harness import common as _common
from bench.harness import workloads as w

SYNC_NAMES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
              "cudaMemcpy", "cudaMemcpyAsync", "cudaStreamWaitEvent", "cudaMalloc", "cudaFree",
              "cudaHostAlloc", "cudaMallocHost")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _loop(model: nn.Module, opt: torch.optim.Optimizer, loader: Any, n_acc: int, steps: int,
          loss_fn: Any, device: str) -> None:
    loader.batch_sampler.set_epoch(0)
    model.train()
    done = 0
    for index, (inputs, targets) in enumerate(loader):
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        (loss_fn(model(inputs), targets) / n_acc).backward()
        if (index + 1) % n_acc == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
            done += 1
            if done >= steps:
                return


def _trainer(model: nn.Module, opt: torch.optim.Optimizer, loader: Any, n_acc: int, steps: int,
             loss_fn: Any, device: str) -> tuple[float, float]:
    """(construction seconds, fit seconds), synchronised around each."""
    _sync(device)
    start = time.perf_counter()
    trainer = Trainer(model, opt, loss_fn=loss_fn, accumulation_steps=n_acc, device=device)
    _sync(device)
    built = time.perf_counter()
    if steps:
        trainer.fit(loader, epochs=1, max_steps=steps)
    _sync(device)
    return built - start, time.perf_counter() - built


def _workload(name: str, model: nn.Module, data: Any, m: int, n_acc: int, steps_list: list[int],
              repeats: int, warmup: int, device: str) -> dict[str, Any]:
    loss_fn = nn.CrossEntropyLoss()
    loader = make_loader(data, m, seed=0)
    models = {k: w.clone(model).to(device) for k in ("trainer", "loop")}
    opts = {k: torch.optim.SGD(v.parameters(), lr=0.01, momentum=0.9) for k, v in models.items()}
    rows = []
    for steps in steps_list:
        build: list[float] = []
        fit: list[float] = []
        loop: list[float] = []

        def run_trainer(record: bool, steps: int = steps, build: list[float] = build,
                        fit: list[float] = fit) -> None:
            b, f = _trainer(models["trainer"], opts["trainer"], loader, n_acc, steps, loss_fn, device)
            if record:
                build.append(b)
                fit.append(f)

        def run_loop(record: bool, steps: int = steps, loop: list[float] = loop) -> None:
            _sync(device)
            start = time.perf_counter()
            if steps:
                _loop(models["loop"], opts["loop"], loader, n_acc, steps, loss_fn, device)
            _sync(device)
            if record:
                loop.append(time.perf_counter() - start)

        for _ in range(warmup):
            run_trainer(False)
            run_loop(False)
        for r in range(repeats):
            order = (run_trainer, run_loop) if r % 2 == 0 else (run_loop, run_trainer)
            for fn in order:
                fn(True)
        total = [b + f for b, f in zip(build, fit, strict=True)]
        extra = [t - lp for t, lp in zip(total, loop, strict=True)]
        rows.append({
            "steps": steps,
            "trainer_ms": 1e3 * _common.median(total),
            "construct_ms": 1e3 * _common.median(build),
            "fit_ms": 1e3 * _common.median(fit),
            "loop_ms": 1e3 * _common.median(loop),
            "extra_ms": 1e3 * _common.median(extra),
            "runs_ms": {"construct": [1e3 * x for x in build], "fit": [1e3 * x for x in fit],
                        "loop": [1e3 * x for x in loop]},
        })
        print(f"{name:24s} k={steps:3d}: trainer {rows[-1]['trainer_ms']:8.2f} ms "
              f"(construct {rows[-1]['construct_ms']:.2f}, fit {rows[-1]['fit_ms']:.2f}) "
              f"loop {rows[-1]['loop_ms']:8.2f} ms extra {rows[-1]['extra_ms']:+.2f} ms", file=sys.stderr, flush=True)
    # Per-fit (intercept) and per-step (slope) parts of the extra time, from the 1- and last-k rows.
    fits = [r for r in rows if r["steps"] > 0]
    slope = intercept = None
    if len(fits) >= 2:
        a, b = fits[0], fits[-1]
        slope = (b["extra_ms"] - a["extra_ms"]) / (b["steps"] - a["steps"])
        intercept = a["extra_ms"] - slope * a["steps"]
    return {"workload": name, "m": m, "N": n_acc, "rows": rows,
            "extra_per_fit_ms": intercept, "extra_per_step_ms": slope,
            "profile": _profile(models["trainer"], opts["trainer"], loader, n_acc, loss_fn, device)}


def _profile(model: nn.Module, opt: torch.optim.Optimizer, loader: Any, n_acc: int, loss_fn: Any,
             device: str, top: int = 25) -> dict[str, Any]:
    """One 1-step fit (Trainer() included): cProfile's top functions by own time, and the CUDA
    runtime calls torch.profiler saw (count, host us)."""
    _trainer(model, opt, loader, n_acc, 1, loss_fn, device)  # warm
    profiler = cProfile.Profile()
    profiler.enable()
    _trainer(model, opt, loader, n_acc, 1, loss_fn, device)
    profiler.disable()
    stats = pstats.Stats(profiler)
    entries = []
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        entries.append({"function": f"{filename.split('site-packages/')[-1].split('/src/')[-1]}:{line}({func})",
                        "calls": nc, "self_ms": 1e3 * tt, "cum_ms": 1e3 * ct})
    by_self = sorted(entries, key=lambda e: -e["self_ms"])[:top]
    by_cum = [e for e in sorted(entries, key=lambda e: -e["cum_ms"]) if "accumcore" in e["function"]][:top]
    text = io.StringIO()
    text.write(f"cProfile, one Trainer() + fit(max_steps=1), {device}: top {top} by own time\n")
    for e in by_self:
        text.write(f"  {e['self_ms']:8.3f} ms self {e['cum_ms']:8.3f} cum {e['calls']:6d}x  {e['function']}\n")
    text.write(f"accumcore functions by cumulative time (top {top})\n")
    for e in by_cum:
        text.write(f"  {e['cum_ms']:8.3f} ms cum {e['self_ms']:8.3f} self {e['calls']:6d}x  {e['function']}\n")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        _trainer(model, opt, loader, n_acc, 1, loss_fn, device)
    runtime: dict[str, dict[str, float]] = {}
    ops = []
    for avg in prof.key_averages():
        if avg.key.startswith(("cuda", "Memcpy", "Memset")) or avg.key in SYNC_NAMES:
            runtime[avg.key] = {"count": avg.count, "host_us": avg.self_cpu_time_total}
        ops.append({"name": avg.key, "count": avg.count, "self_cpu_us": avg.self_cpu_time_total})
    ops = sorted(ops, key=lambda o: -o["self_cpu_us"])[:top]
    text.write("torch.profiler: CUDA runtime calls (count, host us)\n")
    for key, value in sorted(runtime.items(), key=lambda kv: -kv[1]["host_us"]):
        text.write(f"  {value['count']:6d}x {value['host_us']:10.1f} us  {key}\n")
    text.write(f"torch.profiler: top {top} ops by self CPU time\n")
    for o in ops:
        text.write(f"  {o['self_cpu_us']:10.1f} us {o['count']:6d}x  {o['name']}\n")
    print(text.getvalue(), file=sys.stderr, flush=True)
    return {"cprofile_self": by_self, "cprofile_accumcore_cum": by_cum, "cuda_runtime": runtime,
            "profiler_ops": ops}


def main() -> None:
    args = _common.base_parser(__doc__.splitlines()[0]).parse_args()
    _common.configure(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    repeats, warmup = args.repeats or (1 if args.quick else 9), _common.warmups(args)
    if args.quick:
        steps = [0, 1, 2, 4]
        results = [
            _workload("mlp 64-16-16-10", w.mlp(64, 16), w.image_data(64, (1, 8, 8)), 4, 2, steps, repeats, warmup, device),
            _workload("small_cnn 3x8x8", w.small_cnn(width=4), w.image_data(64, (3, 8, 8)), 4, 2, steps, repeats, warmup, device),
        ]
    else:
        steps = [0, 1, 2, 64]
        results = [
            _workload("mlp 784-256-256-10", w.mlp(), w.image_data(8192), 32, 4, steps, repeats, warmup, device),
            _workload("small_cnn 3x32x32", w.small_cnn(), w.image_data(8192, (3, 32, 32)), 32, 4, steps, repeats, warmup, device),
        ]
    worst = max((r["extra_per_fit_ms"] or 0.0) for r in results)
    out: dict[str, Any] = {
        "machine": _common.machine(device),
        "figure": "Trainer() + fit(max_steps=k) - hand loop of k steps: per-fit part (ms, intercept over k)",
        "target": "shown (find the per-fit cost)", "measured": worst, "verdict": "shown",
        "repeats": repeats, "results": results,
    }
    _common.emit("fit_setup", out, args)


if __name__ == "__main__":
    main()
