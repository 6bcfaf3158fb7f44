"""Run every bench script and regenerate docs/benchmarks.md (what `make bench` does).

    .venv/bin/python -m bench.run_all                 # run all, append rows, rewrite the doc
                                                      # (no GPU: --threads 1 --clock cpu by default)
    .venv/bin/python -m bench.run_all --only memory   # run some, rewrite the doc
    .venv/bin/python -m bench.run_all --no-run        # rewrite the doc from bench/results/

Every module of bench/trainer/ (the trainer library alone) and bench/service/ (through the
API and workers) that runs as a program (`python -m bench.<package>.<name>`) is a bench; each
prints one JSON object and appends it to bench/results/<name>.jsonl. The doc shows the latest row of
each per device (CPU, GPU), one line per figure, then bench/notes.md (analysis of misses: profile, fix, plan).
Scripts run one after the other: they measure ratios on a shared machine, and two at once
would measure each other.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
DEFAULT_DOC = ROOT / "docs" / "benchmarks.md"
NOTES = BENCH / "notes.md"
# Ours first, in the order; any other bench script (owned by other parts) after.
ORDER = ["trainer_vs_loop", "trainer_vs_lightning", "exactness", "memory", "accumulation_cost",
         "auto_micro_batch", "ddp_no_sync", "resnet50_h100", "host_cost"]


BENCH_PACKAGES = ("trainer", "service")


def bench_modules() -> dict[str, str]:
    """Bench name -> module (`exactness` -> `bench.trainer.exactness`): the modules that run as
    programs; helpers they share (bench/harness/, exactness_corners.py) do not."""
    found = {}
    for package in BENCH_PACKAGES:
        for path in sorted((BENCH / package).glob("*.py")):
            if 'if __name__ == "__main__":' in path.read_text():
                found[path.stem] = f"bench.{package}.{path.stem}"
    return found


def bench_names() -> list[str]:
    found = sorted(bench_modules())
    return [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]


def run(name: str, quick: bool, timeout_s: float, extra: list[str]) -> None:
    command = [sys.executable, "-m", bench_modules()[name]]
    command += ["--quick"] if quick else ["--out", str(RESULTS)]  # smoke runs keep no rows
    if name in ORDER:  # --threads/--clock are ours; other parts' scripts keep their own flags
        command += extra
    started = time.monotonic()
    print(f"[bench] {name} ...", file=sys.stderr, flush=True)
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        print(f"[bench] {name}: timed out after {timeout_s:.0f} s", file=sys.stderr)
        return
    if completed.returncode != 0:
        print(f"[bench] {name}: exit {completed.returncode}\n{completed.stderr[-3000:]}", file=sys.stderr)
        return
    print(f"[bench] {name}: done in {time.monotonic() - started:.0f} s", file=sys.stderr)


def _has_gpu() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
    return probe.stdout.strip() == "True"


def latest(name: str) -> list[dict[str, Any]]:
    """The newest full run of the bench on each kind of device (cpu, then cuda): a GPU run
    does not hide the CPU figures, nor a later CPU run the GPU's."""
    path = RESULTS / f"{name}.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    newest: dict[str, dict[str, Any]] = {}
    for row in rows:
        if not row.get("quick"):  # smoke runs are not figures
            newest[str(row.get("machine", {}).get("device", "cpu"))] = row
    return [newest[device] for device in sorted(newest)]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.2e}"
        return f"{value:.3f}"
    return str(value)


def _machine(result: dict[str, Any]) -> str:
    m = result.get("machine", {})
    where = m.get("gpu") or f"{m.get('cpu', '?')} x{m.get('cores', '?')} cores"
    text = f"{where}, torch {m.get('torch', '?')}, {m.get('torch_threads', '?')} threads"
    if m.get("clock"):
        text += f", {m['clock']} clock"
    if m.get("load_average_1m") is not None:
        text += f", load {m['load_average_1m']}"
    return text


def _not_measured(skipped: str | None) -> str:
    if skipped and skipped.startswith("no GPU"):
        return "not measured: no GPU was lent to this session"
    return f"not measured: {skipped or '?'}"


def rows_for(name: str, r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, target, measured, verdict) lines for one bench's latest result."""
    def row(figure: str, target: str, measured: Any, verdict: str) -> tuple[str, str, str, str]:
        return (figure, target, _fmt(measured), verdict)

    if name == "trainer_vs_loop":
        fast = r.get("resnet50_fast_path", {})
        return [
            row("Trainer.fit / tutorial loop, fp32 (worst of mlp, small_cnn)",
                f">= {r['target']}", r["measured"], r["verdict"]),
            row("fast path / tutorial loop, ResNet-50 224x224 m=64 (GPU)", ">= 1.5",
                fast.get("ratio"), fast.get("verdict") or _not_measured(fast.get("skipped"))),
        ]
    if name == "trainer_vs_lightning":
        lines = []
        target = r["target"]
        for peer in ("lightning", "accelerate"):
            label = f"{peer} {r.get('peers', {}).get(peer) or ''}".strip()
            if r["measured"].get(peer) is None:
                lines.append(row(f"Trainer / {label} throughput", f">= {target}", None,
                                 f"not measured: {r.get('peers_status')}"))
                continue
            for result in r["results"]:
                workload = result["workload"].split()[0]
                same = result["ratios"][f"accum/{peer}"]
                lines.append(row(f"Trainer / {label} throughput, {workload}, same DataLoader", f">= {target}",
                                 same, "pass" if same >= target else "miss"))
                fast = result["ratios"].get(f"accum_fast/{peer}")
                if fast is not None:
                    lines.append(row(f"  same, accum on DeviceBatches / {label} on DataLoader, {workload}",
                                     f">= {target}", fast, "pass" if fast >= target else "miss"))
        return lines
    if name == "exactness":
        lines = [row("max rel. error of accumulated update vs big batch, accum (fp32)", "<= 1e-6",
                     r["measured"], r["verdict"])]
        for method, errors in r["errors"].items():
            if method in ("accum", "reference"):
                continue
            version = r.get("peers", {}).get(method)
            label = f"  same, {method}" + (f" {version}" if version else "")
            if "status" in errors:
                lines.append(row(label, "(shown)", None, errors["status"]))
                continue
            shown = ", ".join(f"{k} {_fmt(v)}" for k, v in errors.items() if not k.endswith("_steps"))
            lines.append((label, "(shown)", shown, "-"))
        return lines + corner_rows(r.get("corners", {}), r.get("peers", {}))
    if name == "memory":
        return [
            row("peak(m,N) / peak(m,1), Trainer, small_cnn", "<= 1.02", r["measured"], r["verdict"]),
            row("peak(m,N) / peak(mN,1), Trainer, small_cnn", "far below 1", r["big_batch_ratio"],
                "pass" if r["big_batch_ratio"] < 0.5 else "miss"),
        ]
    if name == "auto_micro_batch":
        return [
            row("m chosen by auto / largest m that truly fits (CPU: simulated caps)", ">= 0.9, <= 1", r["measured"], r["verdict"]),
            row("auto search cost, in training steps", "<= 30", r["cost_steps"], r["cost_verdict"]),
        ]
    if name == "resnet50_h100":
        verdict = r["verdict"] if r.get("measured") is not None else _not_measured(r.get("skipped"))
        return [row("ResNet-50 bf16 img/s via API -> worker -> accumcore", ">= 3000", r.get("measured"), verdict)]
    if name == "host_cost":
        return host_cost_rows(r)
    if name == "trainer_overhead":
        lines = []
        for workload, values in r.get("workloads", {}).items():
            verdicts = list(values.get("targets", {}).values()) + ["-", "-"]
            lines.append(row(f"Trainer.fit / tutorial loop throughput, {workload}", ">= 0.99",
                             values.get("throughput_ratio"), verdicts[0]))
            if "throughput_ratio_without_grad_norm" in values:
                lines.append(row("  same, Trainer(grad_norm=False): no per-step gradient-norm pass",
                                 "(shown)", values["throughput_ratio_without_grad_norm"], "-"))
            lines.append(row(f"peak(m,N) / peak(m,1), {workload}", "<= 1.02",
                             values.get("memory_ratio"), verdicts[1]))
        return lines
    if name == "tracker_overhead":
        lines = []
        step_s = 1 / r["steps_per_s_without"]
        for tracker, ratio in r["ratios"].items():
            lines.append(row(f"steps/s logging to {tracker} / without, {r.get('clock', 'wall')} clock, "
                             f"{step_s * 1e3:.2f} ms steps (flush every {r['flush_every_s']} s)",
                             f">= {r['target']}", ratio, "pass" if ratio >= r["target"] else "miss"))
            # The same figure as a cost per step: under 1 % of any step 100x longer than it.
            cost_us = max(1 / ratio - 1, 0.0) * step_s * 1e6
            lines.append(row(f"  same, logging cost per step in us (1 % of a step from {cost_us / 10:.1f} ms)",
                             "(shown)", round(cost_us, 1), "-"))
        return lines
    if name == "worker" and "latency" in r:
        p50s = [v["p50_ms"] for v in r["latency"].values() if isinstance(v, dict) and "p50_ms" in v]
        return [row(r.get("figure", name), _fmt(r.get("target")), r.get("measured"), r.get("verdict", "-")),
                row("queue-to-running latency p50 ms (worst broker)", "<= 100",
                    max(p50s) if p50s else None, r.get("latency_verdict", "-"))]
    if name == "api":
        return api_rows(r)
    if "measured" in r and "target" in r and not isinstance(r["measured"], dict):
        return [row(r.get("figure", name), _fmt(r["target"]), r["measured"], r.get("verdict", "-"))]
    if isinstance(r.get("targets"), dict):  # e.g. the API bench: {"<figure><op><target>": verdict}
        return [(figure, "(in name)", f"see bench/results/{name}.jsonl", str(verdict))
                for figure, verdict in r["targets"].items()]
    return [(r.get("figure", name), "-", "see bench/results/" + name + ".jsonl", "-")]


def host_cost_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The host-cost figure, then its profile: Python calls per micro-batch (load-independent)
    and the functions whose own time exceeds the loop's most, where the microseconds go."""
    calls = r.get("python_calls_per_micro_batch", {})
    lines = [(r["figure"], f"<= {_fmt(r['target'])}", _fmt(r["measured"]), r["verdict"]),
             ("  same, Trainer / loop time per epoch (paired rounds)", "(shown)", _fmt(r.get("time_ratio")), "-"),
             ("  Python calls per micro-batch (cProfile), Trainer / loop / extra", "(shown)",
              " / ".join(_fmt(calls.get(k)) for k in ("trainer", "loop", "extra")), "-")]
    for top in r.get("profile_top", [])[:6]:
        lines.append((f"  profile: `{top['function']}`", "(shown)",
                      f"+{_fmt(top['own_us_per_micro_batch'])} us own, +{_fmt(top['calls_per_micro_batch'])} calls "
                      "per micro-batch", "-"))
    return lines


def corner_rows(corners: dict[str, Any], versions: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """exactness.py's resume and DDP rows: accum's verdict, every method's figure."""
    def label(method: str) -> str:
        return f"{method} {versions.get(method) or ''}".strip()

    lines = []
    resume = corners.get("plain_loader_resume")
    if resume:
        shown = ", ".join(
            f"{label(m)} {v['status']}" if "status" in v
            else f"{label(m)} {'yes' if v['bitwise'] else 'no'} ({_fmt(v['max_abs_diff'])})"
            for m, v in resume.items()
        )
        lines.append(("DataLoader(shuffle=True) + dropout, stopped after 8 steps and resumed: bitwise "
                      "(max abs diff of the weights)", "bitwise (accum)", shown,
                      "pass" if resume["accum"]["bitwise"] else "miss"))
    ddp = corners.get("ddp_uneven_shards")
    if ddp:
        shown = ", ".join(f"{label(m)} {v['status'] if 'status' in v else _fmt(v['error'])}" for m, v in ddp.items())
        lines.append(("DDP 2 ranks, uneven shards (9 samples, m=2, N=2): max rel. error of the weights vs "
                      "the big batch", "<= 1e-6 (accum)", shown, "pass" if ddp["accum"]["error"] <= 1e-6 else "miss"))
    return lines


def api_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The API bench's figures (bench/service/api.py): each target with its measured value."""
    targets = r.get("targets", {})
    submit, closed = r.get("submit_at_300_rps", {}), r.get("submit_closed_loop", {})
    pages = r.get("metrics_page", {})
    page_p50s = [v["p50_ms"] for v in pages.values() if isinstance(v, dict) and "p50_ms" in v]
    points = r.get("setup", {}).get("metric_points", 100_000)
    startup = r.get("startup", {})
    torch_imported = startup.get("torch_imported")
    return [
        (f"POST /v1/jobs p99 ms at {submit.get('offered_req_per_s', 300):g} req/s offered",
         "<= 25", _fmt(submit.get("p99_ms")), targets.get("submit_p99_ms_at_300_rps<=25", "-")),
        ("POST /v1/jobs req/s, 32 clients back to back (capacity)", ">= 300",
         _fmt(closed.get("req_per_s")), targets.get("submit_req_per_s>=300", "-")),
        ("  same, API CPU ms per POST (what bounds req/s)", "(shown)",
         _fmt(closed.get("server_cpu_ms_per_request")), "-"),
        (f"metrics page of 1000 points ms (p50, worst of first/middle; {points} points)", "<= 50",
         _fmt(max(page_p50s) if page_p50s else None), targets.get("metrics_page_ms<=50", "-")),
        (f"metrics max_points=500 over {points} points ms (p50)", "<= 50",
         _fmt(r.get("metrics_downsampled", {}).get("p50_ms")),
         targets.get("metrics_downsampled_ms<=50", "-")),
        ("API start to first /healthz answer, s", "< 2",
         _fmt(startup.get("seconds_to_healthz")), targets.get("startup_s<2", "-")),
        ("torch imported by the API process", "no",
         "-" if torch_imported is None else ("yes" if torch_imported else "no"),
         targets.get("no_torch_in_api", "-")),
    ]


def write_doc(names: list[str], doc: Path = DEFAULT_DOC) -> None:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python -m bench.run_all`) from the latest row of each "
        "`bench/results/<name>.jsonl` per device (CPU, GPU); how to run each: `bench/README.md`. Every figure is a ratio "
        "measured in one run on one machine (medians over interleaved repeats after warm-up).",
        "",
        "| bench | figure | target | measured | verdict | machine | when |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        results = latest(name)
        if not results:
            lines.append(f"| {name} | - | - | - | not run yet | - | - |")
        measured_on_gpu = any(r.get("machine", {}).get("device") == "cuda" for r in results)
        for result in results:
            try:
                figures = rows_for(name, result)
            except (KeyError, TypeError) as error:
                figures = [(result.get("figure", name), "-", f"unreadable row ({error})", "-")]
            for figure, target, measured, verdict in figures:
                if measured_on_gpu and measured == "-" and "no GPU" in verdict:
                    continue  # the GPU run's row below holds this figure
                lines.append(f"| {name} | {figure} | {target} | {measured} | {verdict} | "
                             f"{_machine(result)} | {result.get('when', '?')} |")
    lines.append("")
    if NOTES.exists():
        lines.append(NOTES.read_text().rstrip() + "\n")
    doc.write_text("\n".join(lines))
    print(f"[bench] wrote {doc}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="bench names to run (default: all)")
    parser.add_argument("--no-run", action="store_true", help="only rewrite the doc from bench/results/")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a smoke run: no rows kept")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per bench script")
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC, help="where to write the table")
    parser.add_argument("--threads", type=int, default=None,
                        help="passed to our bench scripts (default: 1 without a GPU, see --clock)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default=None,
                        help="passed to our bench scripts (default: cpu without a GPU, wall with one)")
    args = parser.parse_args()
    names = bench_names()
    if not args.no_run:
        unknown = set(args.only or []) - set(names)
        if unknown:
            parser.error(f"unknown bench {sorted(unknown)}; known: {', '.join(names)}")
        if args.clock is None and not _has_gpu():
            # On a small shared CPU machine wall-clock ratios with 2 threads swing 0.04-15 per
            # round (bench/notes.md); one thread on the process CPU clock is what holds.
            args.clock = "cpu"
            args.threads = 1 if args.threads is None else args.threads
        extra = [] if args.threads is None else ["--threads", str(args.threads)]
        extra += [] if args.clock is None else ["--clock", args.clock]
        for name in args.only or names:
            run(name, args.quick, args.timeout, extra)
    write_doc(names, args.doc)


if __name__ == "__main__":
    main()
