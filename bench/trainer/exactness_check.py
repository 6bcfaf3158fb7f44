"""Cost of the first-window exactness check (``Trainer(verify_window=True)``, issue 18).

    .venv/bin/python -m bench.trainer.exactness_check [--quick] [--repeats 5] [--threads 1] [--clock wall|cpu] [--out [DIR]]

Prints one JSON object. On the demo job (examples/digits_small_cnn.yaml: small_cnn on digits,
m = 16, N = 4, 4 epochs, built by the worker's own ``build_run``):

- ``check_over_step``: wall time of the check (``accumcore.verify_window.check_window`` on the
  first window) / wall time of one optimizer step (a ``fit`` of ``STEPS`` steps, divided),
  medians of per-round ratios, the two interleaved and their order alternating each round.
  Expected about 2-3 steps' worth: a window's forward/backward twice, in eval mode.
- ``job_time_ratio``: the demo job's training time (``fit`` of the whole job) with the check /
  without it, interleaved the same way. Target <= 1.02.
- ``check_share_of_job``: the check's time / the job's time without it (medians): the same
  cost read from the steadier short measurement, which a 1 % change in a 13 s run on a shared
  machine does not drown.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from accumcore.verify_window import check_window
from accumcore.window import make_micro_batches
from bench.harness.common import RESULTS_DIR, ROOT
from services.spec import parse_spec
from services.worker.build import build_run

BENCH = "exactness_check"
SPEC_FILE = ROOT / "examples" / "digits_small_cnn.yaml"
STEPS = 20  # optimizer steps timed per round for the step time
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]  # set from --clock
TARGET_JOB_RATIO = 1.02


def demo_spec(quick: bool) -> Any:
    raw = yaml.safe_load(SPEC_FILE.read_text())
    raw["gpus"] = 0
    if quick:
        raw.pop("epochs")
        raw["max_steps"] = 3
    return parse_spec(raw)


def fresh_run(spec: Any, verify: bool) -> Any:
    run = build_run(spec, callbacks=[], checkpoint_dir=None, device="cpu")
    run.trainer.verify_window = verify
    return run


def time_check(spec: Any) -> float:
    run = fresh_run(spec, False)
    trainer = run.trainer
    batches = iter(run.train_loader)
    window = [next(batches) for _ in range(trainer.schedule.at(0))]
    micro = make_micro_batches(window, 1, trainer.count_items)
    started = clock()
    result = check_window(trainer.model, trainer.loss_fn, micro, trainer.device)
    elapsed = clock() - started
    assert result.rel_error is not None and result.rel_error <= 1e-6, result
    return elapsed


def time_steps(spec: Any, steps: int) -> float:
    run = fresh_run(spec, False)
    started = clock()
    run.trainer.fit(run.train_loader, epochs=1, max_steps=steps)
    return (clock() - started) / steps


def time_job(spec: Any, verify: bool) -> float:
    run = fresh_run(spec, verify)
    started = clock()
    history = run.trainer.fit(run.train_loader, **run.fit_kwargs)
    elapsed = clock() - started
    checks = [e for e in history.events if e["kind"] == "exactness_check"]
    assert len(checks) == int(verify) and all(e["data"]["passed"] for e in checks)
    return elapsed


def interleaved(first: Any, second: Any, repeats: int) -> tuple[list[float], list[float], list[float]]:
    """(first times, second times, per-round ratios first/second), alternating which runs first."""
    a_times, b_times, ratios = [], [], []
    for round_ in range(repeats):
        if round_ % 2 == 0:
            a, b = first(), second()
        else:
            b, a = second(), first()
        a_times.append(a)
        b_times.append(b)
        ratios.append(a / b)
    return a_times, b_times, ratios


def machine(clock_name: str) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "device": "cpu", "clock": clock_name,
            "load_average_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run; measures nothing")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="cpu: the process's CPU time (steadier on a shared machine, with --threads 1)")
    parser.add_argument("--out", nargs="?", const=str(RESULTS_DIR),
                        help="append the JSON line to DIR/exactness_check.jsonl")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    global clock
    clock = CLOCKS[args.clock]
    repeats = 2 if args.quick else args.repeats
    steps = 2 if args.quick else STEPS
    spec = demo_spec(args.quick)
    time_check(spec)  # warm-up: first-call allocations, the dataset's first load
    check_s, step_s, check_ratios = interleaved(lambda: time_check(spec), lambda: time_steps(spec, steps), repeats)
    with_s, without_s, job_ratios = interleaved(lambda: time_job(spec, True), lambda: time_job(spec, False), repeats)
    job_ratio = statistics.median(job_ratios)
    result = {
        "bench": BENCH,
        "quick": args.quick,
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(args.clock),
        "workload": "demo job: small_cnn on digits, m=16, N=4, 4 epochs (examples/digits_small_cnn.yaml), CPU",
        "figure": "check time / one optimizer step; demo job time with the check / without",
        "target": f"about 2-3 steps; job ratio <= {TARGET_JOB_RATIO}",
        "check_over_step": statistics.median(check_ratios),
        "check_s": statistics.median(check_s),
        "step_s": statistics.median(step_s),
        "job_time_ratio": job_ratio,
        "check_share_of_job": statistics.median(check_s) / statistics.median(without_s),
        "job_with_check_s": statistics.median(with_s),
        "job_without_check_s": statistics.median(without_s),
        "verdict": "pass" if job_ratio <= TARGET_JOB_RATIO else "miss",
        "runs": {"check_ratios": check_ratios, "job_ratios": job_ratios, "repeats": repeats},
    }
    line = json.dumps(result)
    print(line)
    if args.out and not args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with (out / f"{BENCH}.jsonl").open("a") as handle:
            handle.write(line + "\n")


if __name__ == "__main__":
    main()
