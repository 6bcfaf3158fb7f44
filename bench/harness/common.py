"""Shared helpers for the bench scripts: machine description, timing, JSON output, result rows.

Every bench script prints one JSON object to stdout (and nothing else there), so
`python -m bench.run_all` and the smoke tests can parse it. `--out DIR` also appends the object as
one line to `DIR/<bench>.jsonl` (default folder: bench/results/).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "bench" / "results"
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
# The clock `timed` reads; set once per process from --clock by `configure`.
_clock = {"name": "wall"}


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str | None = None) -> dict[str, Any]:
    """What the figures were measured on; every bench output carries this."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - every bench needs torch except the peers' setup
        info["torch"] = None
    info["device"] = device or ("cuda" if info.get("gpu") else "cpu")
    info["clock"] = _clock["name"]
    info["load_average_1m"] = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    return info


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def paired_ratio(numerators: list[float], denominators: list[float]) -> float:
    """Median of the per-round ratios a_i / b_i of two interleaved series.

    Robust to load that drifts during the run (each round's two runs saw about the same
    load), unlike the ratio of the two medians.
    """
    return median([a / b for a, b in zip(numerators, denominators, strict=True)])


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call takes on the configured clock; synchronises CUDA so queued kernels count.

    "wall" (default) is what a user waits. "cpu" is this process's CPU time: on a machine shared
    with other work it counts only our own work, so ratios stay stable under load; use it with
    --threads 1 (with more threads, spinning OpenMP workers would be counted too).
    """
    sync = _cuda_sync()
    clock = CLOCKS[_clock["name"]]
    sync()
    start = clock()
    fn()
    sync()
    return clock() - start


def _cuda_sync() -> Callable[[], None]:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.synchronize
    except ImportError:  # pragma: no cover
        pass
    return lambda: None


def interleaved(
    runners: dict[str, Callable[[], float]], repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Run each runner `warmup` times, then `repeats` rounds in alternating order: A B, B A, ...

    Interleaving matters on a shared machine: a burst of load from another process then hits
    both sides of a ratio instead of one; alternating the order cancels any advantage of
    running first or second in a round. Each runner returns its own measure (seconds or a
    rate); the lists of measures are returned per name.
    """
    for _ in range(warmup):
        for run in runners.values():
            run()
    samples: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for round_index in range(repeats):
        for name in names if round_index % 2 == 0 else reversed(names):
            samples[name].append(runners[name]())
    return samples


def warmups(args: argparse.Namespace) -> int:
    """Untimed warm-up rounds: none in --quick (a smoke run measures nothing)."""
    return 0 if args.quick else 1


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    add_out_argument(parser)
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall (default) or cpu: process CPU time, stable on a loaded machine")
    return parser


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """``--out [DIR]``, which bench/run_all.py passes to every bench script (see ``emit``)."""
    parser.add_argument(
        "--out",
        nargs="?",
        const=str(RESULTS_DIR),
        default=None,
        help="also append the JSON as a row to OUT/<bench>.jsonl (default bench/results/)",
    )


def configure(args: argparse.Namespace) -> None:
    """Apply --threads and --clock for this process."""
    set_threads(args.threads)
    set_clock(args.clock)


def set_clock(name: str) -> None:
    if name not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(sorted(CLOCKS))}, got {name!r}")
    _clock["name"] = name


def emit(bench: str, result: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the result as JSON on stdout; with --out, append it to OUT/<bench>.jsonl.

    Rows carry "quick": true when measured in --quick mode; docs/benchmarks.md skips them.
    """
    out: str | None = args.out
    row = {
        "bench": bench,
        "when": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": bool(args.quick),
        **result,
    }
    text = json.dumps(row, sort_keys=False, default=float)
    print(text)
    sys.stdout.flush()
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / f"{bench}.jsonl").open("a") as handle:
            handle.write(text + "\n")


def verdict(measured: float | None, target: float, higher_is_better: bool) -> str:
    """'pass' / 'miss' against a target, or 'not measured' when there is no figure."""
    if measured is None:
        return "not measured"
    ok = measured >= target if higher_is_better else measured <= target
    return "pass" if ok else "miss"


def set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)
