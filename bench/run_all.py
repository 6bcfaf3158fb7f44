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
    where = m.get("gpu") or f"{m.get('cpu', '?')} x{m.get('cores', m.get('cpu_count', '?'))} cores"
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
        return tracker_rows(r)
    if name == "worker" and "latency" in r:
        p50s = [v["p50_ms"] for v in r["latency"].values() if isinstance(v, dict) and "p50_ms" in v]
        return [row(r.get("figure", name), _fmt(r.get("target")), r.get("measured"), r.get("verdict", "-")),
                row("queue-to-running latency p50 ms (worst broker)", "<= 100",
                    max(p50s) if p50s else None, r.get("latency_verdict", "-"))] + callback_overhead_rows(r)
    if name == "api":
        return api_rows(r)
    if name == "enqueue":
        return [row(r["figure"], "(decides the path)", r["cpu_ratio"], "-"),
                row("  same, CPU us per message: send_task / hand-built", "(shown)",
                    f"{r['send_task_cpu_us']} / {r['hand_built_cpu_us']}", "-")]
    if name == "spec_limits":
        return [row(f"submit-time limits / spec parsing, CPU per submit, {spec}", "(shown)",
                    values["ratio_limits_to_parse"], f"{values['limit_errors_us']} us vs {values['parse_spec_us']} us")
                for spec, values in r["specs"].items()]
    if name == "own_data":
        return own_data_rows(r)
    if name == "exactness_check":
        return [row("check time / one optimizer step (median of per-round ratios)", "about 2-3 steps",
                    r["check_over_step"], "-"),
                row("  same, check time / demo job's training time without it", "<= 2 %",
                    f"{r['check_share_of_job'] * 100:.2f} %", r["verdict"]),
                row("  same, demo job's training time with the check / without", "<= 1.02",
                    r["job_time_ratio"], "pass" if r["job_time_ratio"] <= 1.02 else "miss")]
    if name == "artifacts":
        throughput = r["throughput"]
        ratio, target = throughput["ratio_checkpointed_over_none"], throughput["target"]
        return [row(f"steps/s checkpointing every 2 s to the S3 server / without ({throughput['steps']} steps, "
                    f"{throughput['checkpoints_per_run']} checkpoints)", f">= {target}", ratio,
                    "pass" if ratio >= target else "miss"),
                row("  same, the trainer's own checkpoint write, ms (with fsync / without)", "(shown)",
                    f"{r['trainer_checkpoint_ms']['fsync']} / {r['trainer_checkpoint_ms']['no_fsync']}", "-")]
    if name == "fsdp_memory":  # one row per world size k
        return [row(f"per-rank peak memory, FSDP sync per micro-batch / DDP, k={k} gloo processes, N=4",
                    f"<= {_fmt(1 / int(k) + 0.10)}", value,
                    "pass" if value <= 1 / int(k) + 0.10 else "miss")
                for k, value in r["measured"].items()]
    if name == "job_start":
        return job_start_rows(r)
    if name == "memory_levers":
        return memory_levers_rows(r)
    if name == "multi_node":
        return [row("max abs distance of final weights (float32), gpus: 2 and nodes: 2 (N: 2) vs one process "
                    f"(N: 4), {r['steps']} steps", f"<= {_fmt(r['target'])}", r["measured"], r["verdict"]),
                row("  same, steps/s of nodes: 2 (one gloo rank per worker) / gpus: 2 (two ranks on one worker)",
                    "(shown)", r["throughput_nodes_2_over_gpus_2"], "-")]
    if "measured" in r and "target" in r and not isinstance(r["measured"], dict):
        return [row(r.get("figure", name), _fmt(r["target"]), r["measured"], r.get("verdict", "-"))]
    if isinstance(r.get("targets"), dict):  # e.g. the API bench: {"<figure><op><target>": verdict}
        return [(figure, "(in name)", f"see bench/results/{name}.jsonl", str(verdict))
                for figure, verdict in r["targets"].items()]
    return [(r.get("figure", name), "-", "see bench/results/" + name + ".jsonl", "-")]


def memory_levers_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench/trainer/memory_levers.py: per workload the activation peak and the recompute's
    cost; LoRA's trainable parameters and optimizer states; the GPU rows, predicted."""
    lines = []
    for workload, values in r["workloads"].items():
        peak = values["activation_peak_mb"]
        ratio = values["activation_ratio"]
        lines += [
            (f"activation peak, checkpointing every block / plain, {workload}, m={values['m']} "
             f"({peak['plain']:.1f} -> {peak['checkpointed']:.1f} MB)", "< 1", _fmt(ratio),
             "pass" if ratio < 1 else "miss"),
            ("  same, Trainer.fit time checkpointed / plain (the recompute)", "(shown)",
             _fmt(values["step_time_ratio"]), "-"),
        ]
    lora, full = r["lora"]["lora"], r["lora"]["full"]
    lines += [
        (f"LoRA r {r['config']['lora_r']} on c_attn, trainable parameters (tiny GPT-2): LoRA / full", "(shown)",
         f"{lora['trainable']:,} / {full['trainable']:,}", "-"),
        ("  same, AdamW state bytes after a step: LoRA / full", "(shown)", _fmt(r["lora"]["state_ratio"]),
         f"{lora['optimizer_state_bytes']:,} / {full['optimizer_state_bytes']:,} B"),
    ]
    gpt2 = next(iter(r["workloads"].values()), {})
    for model, values in r.get("gpu", {}).items():
        lines.append((
            f"GPU: {model}, 512 tokens, m=4: peak memory and tokens/s against HF Trainer, same levers",
            "(one GPU run)",
            f"predicted: weights + grads + AdamW {values['full_adamw_gb']:.1f} GB full, "
            f"{values['lora_adamw_gb']:.2f} GB with LoRA r {r['config']['lora_r']} ({values['lora_parameters']:,} "
            f"of {values['parameters']:,} trained); activations x{_fmt(gpt2.get('activation_ratio'))} "
            "with checkpointing (the CPU GPT-2 row)",
            _not_measured(values["status"].removeprefix("not measured: ")),
        ))
    return lines


def job_start_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench/service/job_start.py: the issue's four targets, then each way's seconds and the
    embedded worker's phases."""
    figures, verdicts = r["figures"], list(r["targets"].values())
    emb = figures["embedded"]
    lines = [
        ("46-step digits job, submit -> first step, warm embedded worker (s)", "<= 0.5",
         _fmt(emb["first_step_s"]), verdicts[0]),
        ("  same, submit -> succeeded / the bare script", "<= 1.5", _fmt(emb["total_over_bare"]), verdicts[1]),
        ("  same, trackers [mlflow, tensorboard] on - off (s)", "<= 0.5", _fmt(r.get("trackers_extra_s")),
         verdicts[2]),
        ("  same, PostgreSQL + Redis - embedded (s)", "<= 0.3", _fmt(r.get("postgres_extra_s")), verdicts[3]),
    ]
    for way, values in figures.items():
        extra = f", overhead over bare {_fmt(values['overhead_s'])} s" if "overhead_s" in values else ""
        start = "start" if way in ("bare", "trainer") else "submit"
        lines.append((f"  {way}: {start} -> first step / -> {'end' if start == 'start' else 'succeeded'} (s){extra}", "(shown)",
                      f"{_fmt(values['first_step_s'])} / {_fmt(values['total_s'])}", "-"))
    for way in ("embedded", "embedded_trackers"):
        taken = figures.get(way, {}).get("phases")
        if taken:
            lines.append((f"  {way}: the worker's phases (s), queued {_fmt(figures[way].get('queued_s'))}",
                          "(shown)", ", ".join(f"{k} {v:.3f}" for k, v in taken.items()), "-"))
    return lines


def tracker_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Each tracker's speed ratio, then its cost per step: with a tracker host process, the
    training process's hand-over thread and the host's CPU; before it, the sink thread's own
    CPU where the row has it (steadier than a ratio under load: a ratio above 1.02 is noise),
    else the cost the ratio implies."""
    lines = []
    step_s = 1 / r["steps_per_s_without"]
    sink_cpu = r.get("sink_cpu_us_per_step", {})
    for tracker, ratio in r["ratios"].items():
        target = r["target"]
        verdict = "pass" if target <= ratio <= 1.02 else "miss" if ratio < target else "noise (see the next row)"
        lines.append((f"steps/s logging to {tracker} / without, {r.get('clock', 'wall')} clock, "
                      f"{step_s * 1e3:.2f} ms steps (flush every {r['flush_every_s']} s)",
                      f">= {target}", _fmt(ratio), verdict))
        if tracker in (handover := r.get("handover_cpu_us_per_step", {})):  # a host process
            share = handover[tracker] * 1e-6 / step_s
            lines.append((f"  same, the training process's hand-over thread, CPU us per step "
                          f"({share * 100:.2f} % of this step)", "< 1 % of the step",
                          _fmt(handover[tracker]), "pass" if share < 0.01 else "miss"))
            lines.append(("  same, the tracker host process (another core), CPU us per step: "
                          "delivering only / all of it from its start-up (imports, open, end)", "(shown)",
                          f"{r['sink_deliver_cpu_us_per_step'][tracker]} / {r['host_cpu_us_per_step'][tracker]}",
                          "-"))
            if tracker in (lag := r.get("delivered_lag_s", {})):
                lines.append(("  same, seconds from the epoch's end (flushed at once) until the tracker had "
                              "every step", "(shown)", _fmt(lag[tracker]), "-"))
            continue
        if tracker in sink_cpu:
            share = sink_cpu[tracker] * 1e-6 / step_s
            lines.append((f"  same, the sink thread's CPU per step in us, open and end included "
                          f"({share * 100:.1f} % of this step)", "< 1 % of the step", _fmt(sink_cpu[tracker]),
                          "pass" if share < 0.01 else "miss"))
            if tracker in (deliver := r.get("sink_deliver_cpu_us_per_step", {})):
                share = deliver[tracker] * 1e-6 / step_s
                lines.append((f"  same, delivering only (opening and finishing the run left out: "
                              f"once an attempt; {share * 100:.1f} % of this step)", "< 1 % of the step",
                              _fmt(deliver[tracker]), "pass" if share < 0.01 else "miss"))
            continue
        cost_us = max(1 / ratio - 1, 0.0) * step_s * 1e6  # under 1 % of any step 100x longer than it
        lines.append((f"  same, logging cost per step in us (1 % of a step from {cost_us / 10:.1f} ms)",
                      "(shown)", _fmt(round(cost_us, 1)), "-"))
    return lines


def callback_overhead_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The store callback's share of fit time, against the bench's own target (< 0.01)."""
    overhead = r.get("store_callback_overhead")
    if not overhead:
        return []
    fraction = overhead["fraction"]
    return [("store callback time / fit time (metrics and events written behind training)", "< 0.010",
             _fmt(fraction), "pass" if fraction < 0.01 else "miss")]


def own_data_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The own-data bench: an image folder and a tiny GPT-2 through the worker's run, against a
    plain loop and transformers' Trainer, and the short last window in float64."""
    image, gpt2, short = r["imagefolder"], r["gpt2_tokens"], r["short_last_window_float64"]
    return [
        ("imagefolder samples/s through the worker's run / plain DataLoader loop (small_cnn, 32x32, m=16, N=2)",
         image["target"], _fmt(image["ratio"]), image["verdict"]),
        ("tiny GPT-2 (hf:gpt2, 2 layers) tokens/s, worker's run / transformers Trainer (same model, data, "
         "m=8 x N=2)", gpt2["target"], _fmt(gpt2["ratio"]), gpt2["verdict"]),
        ("short last window (13 padded rows, m=2, N=3), float64: max abs diff of the weights vs the big batch",
         "<= 1e-12 (accum)", f"accum {_fmt(short['accum_max_abs_diff'])}, transformers Trainer "
         f"{_fmt(short['hf_trainer_max_abs_diff'])}", short["verdict"]),
    ]


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
    """exactness.py's resume, DDP and FSDP rows: accum's verdict, every method's figure."""
    def label(method: str) -> str:
        return f"{method} {versions.get(method) or versions.get(method.split('_')[0]) or ''}".strip()

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
    fsdp = corners.get("fsdp_uneven_shards")
    if fsdp:
        shown = "; ".join(f"{label(m)}{_shards_note(v)} {v['status'].split('. ')[0] if 'status' in v else _fmt(v['error'])}"
                          for m, v in fsdp.items())
        worst = max(fsdp.get(m, {}).get("error", float("inf")) for m in ("accum", "accum_window_sync"))
        lines.append(("FSDP 2 ranks, uneven shards (7 and 6 samples, m=2, N=2, 2 epochs, float64): max rel. error "
                      "of the weights vs the big batch", "<= 1e-6 (accum)", shown, "pass" if worst <= 1e-6 else "miss"))
    return lines


def _shards_note(run: dict[str, Any]) -> str:
    """A run on other shards than the row's (the control) says which."""
    shards = run.get("shards")
    return f" (shards {' and '.join(map(str, shards))})" if shards and shards != [7, 6] else ""


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
