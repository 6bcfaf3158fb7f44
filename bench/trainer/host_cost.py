"""The trainer's own host cost per micro-batch: Trainer.fit against the tutorial loop on a
model whose kernels cost almost nothing (a 16x4 linear layer, m=8, N=4, fp32, SGD).

    .venv/bin/python -m bench.trainer.host_cost [--quick] [--out] [--clock cpu] [--threads 1]

Prints one JSON object:

- ``extra_us_per_micro_batch``: (Trainer epoch - loop epoch) / micro-batches, in
  microseconds, median of interleaved rounds (paired: each round's two runs saw the same
  load). Target <= 10 on CPU. With ``--clock cpu`` the process's CPU time, which other
  processes on a shared machine disturb much less than wall time.
- ``python_calls_per_micro_batch``: Python function calls per micro-batch counted by
  cProfile, for each side and their difference: independent of the machine's load, so it
  shows per-micro-batch work even where timings are noise.
- ``profile_top``: where the extra time goes: of the functions the Trainer calls more often
  than the loop, those whose own time under cProfile exceeds the loop's most (extra calls, and
  extra own microseconds per micro-batch, the median over 7 profiled epochs of each side; own
  times are load-sensitive, the calls are not).
"""

from __future__ import annotations

import cProfile
import functools
import os
import pstats
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from accumcore.data import make_loader
from bench.harness import common as _common
from bench.harness import workloads as w

BENCH = "host_cost"
M, N, D_IN, CLASSES = 8, 4, 16, 4
TARGET_US = 10.0
TOP = 12
PROFILE_RUNS = 7  # profiled epochs per side: own times are their medians


def _setup(samples: int) -> tuple[dict[str, nn.Module], dict[str, torch.optim.Optimizer], Any]:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(samples, D_IN, generator=generator),
                         torch.randint(0, CLASSES, (samples,), generator=generator))
    model = nn.Linear(D_IN, CLASSES)
    models = {"trainer": w.clone(model), "loop": w.clone(model)}
    opts: dict[str, torch.optim.Optimizer] = {
        k: torch.optim.SGD(v.parameters(), lr=0.01, momentum=0.9) for k, v in models.items()
    }
    return models, opts, make_loader(data, M, seed=0)


def _epochs(models: dict[str, nn.Module], opts: dict[str, torch.optim.Optimizer], loader: Any) -> dict[str, Any]:
    loss_fn = nn.CrossEntropyLoss()

    def trainer() -> None:
        w.run_trainer(models["trainer"], opts["trainer"], loader, N, loss_fn)

    def loop() -> None:
        loader.batch_sampler.set_epoch(0)  # the trainer resets it; the loop sees the same order
        w.tutorial_loop(models["loop"], opts["loop"], loader, N, loss_fn, flush_last=True)

    return {"trainer": trainer, "loop": loop}


Own = dict[tuple[str, int, str], tuple[int, float]]


def _profile(fn: Any, micro_batches: int, runs: int) -> tuple[list[Own], float]:
    """Each function's (calls, own seconds) in ``runs`` profiled epochs, and the Python calls
    per micro-batch (the same in every epoch)."""
    epochs = []
    for _ in range(runs):
        profiler = cProfile.Profile()
        profiler.enable()
        fn()
        profiler.disable()
        stats = pstats.Stats(profiler)
        epochs.append({key: (calls, own_s) for key, (_, calls, own_s, _cum, _) in stats.stats.items()})  # type: ignore[attr-defined]
    return epochs, sum(calls for calls, _ in epochs[0].values()) / micro_batches


def _top(trainer: list[Own], loop: list[Own], micro_batches: int) -> list[dict[str, Any]]:
    """Where the Trainer's extra time goes: of the functions it calls more often than the loop,
    those whose own time exceeds the loop's most (file:line function; extra calls, and the
    median over the profiled epochs of the extra own microseconds per micro-batch: one epoch's
    own times carry the load's spikes, tens of us on whatever function was running)."""
    rows: list[dict[str, Any]] = []
    for key, (calls, _) in trainer[0].items():
        their_calls = loop[0].get(key, (0, 0.0))[0]
        if calls <= their_calls:
            continue  # called as often by the loop (backward, the kernels): a difference is load
        path, line, name = key
        if path == __file__:
            continue  # this bench's wrappers: their own time is the collector's and the profiler's
        extra_s = _common.median([ours.get(key, (0, 0.0))[1] - theirs.get(key, (0, 0.0))[1]
                                  for ours, theirs in zip(trainer, loop, strict=True)])
        rows.append({"function": f"{os.path.basename(path)}:{line} {name}" if line else name,
                     "calls_per_micro_batch": round((calls - their_calls) / micro_batches, 3),
                     "own_us_per_micro_batch": round(extra_s * 1e6 / micro_batches, 2)})
    rows.sort(key=lambda r: -r["own_us_per_micro_batch"])
    return rows[:TOP]


def measure(args: Any) -> dict[str, Any]:
    samples = 256 if args.quick else 2048
    micro_batches = samples // M
    models, opts, loader = _setup(samples)
    runners = _epochs(models, opts, loader)
    repeats = 3 if args.quick else (args.repeats or 31)
    timed: dict[str, Any] = {k: functools.partial(_common.timed, fn) for k, fn in runners.items()}
    runs = _common.interleaved(timed, repeats, _common.warmups(args))
    extra_us = _common.median([(t - lo) * 1e6 / micro_batches for t, lo in zip(runs["trainer"], runs["loop"],
                                                                               strict=True)])
    calls = {}
    stats = {}
    profiled = 1 if args.quick else PROFILE_RUNS
    for name, fn in runners.items():
        stats[name], calls[name] = _profile(fn, micro_batches, profiled)
    return {
        "model": f"Linear({D_IN}, {CLASSES})", "m": M, "N": N, "micro_batches_per_epoch": micro_batches,
        "repeats": repeats,
        "figure": "Trainer.fit host cost above the tutorial loop, us per micro-batch (16x4 linear, m=8, N=4)",
        "target": TARGET_US,
        "measured": extra_us,
        "verdict": _common.verdict(extra_us, TARGET_US, higher_is_better=False),
        "trainer_us_per_micro_batch": _common.median(runs["trainer"]) * 1e6 / micro_batches,
        "loop_us_per_micro_batch": _common.median(runs["loop"]) * 1e6 / micro_batches,
        "time_ratio": _common.paired_ratio(runs["trainer"], runs["loop"]),
        "python_calls_per_micro_batch": {"trainer": calls["trainer"], "loop": calls["loop"],
                                         "extra": calls["trainer"] - calls["loop"]},
        "profile_epochs": profiled,
        "profile_top": _top(stats["trainer"], stats["loop"], micro_batches),
    }


def main() -> None:
    parser = _common.base_parser(__doc__.splitlines()[0])
    args = parser.parse_args()
    _common.configure(args)
    result = {"machine": _common.machine("cpu"), **measure(args)}
    _common.emit(BENCH, result, args)


if __name__ == "__main__":
    main()
