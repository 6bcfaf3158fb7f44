"""Write docs/reliability.md from the recorded reliability figures (`make reliability-report`).

    .venv/bin/python tools/reliability_report.py            # rewrite the doc from the records

Sources, newest row of each:
- bench/results/reliability/<key>.json: one row per reliability test, written by the tests in
  tests/reliability/ when ACCUM_RECORD_RELIABILITY=1 (`make test-reliability` sets it);
- bench/results/load.jsonl: bench/service/load.py (API p99 and training slowdown under load).

Nothing here runs a test: the table shows what was measured, when and where.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RECORDS = BENCH / "results" / "reliability"
LOAD = BENCH / "results" / "load.jsonl"
DOC = ROOT / "docs" / "reliability.md"
AREA_ORDER = ["fault", "bad input", "auth", "limits", "load"]

HEADER = """# Reliability

What accum promises under faults, bad input, abuse and load, and what was measured. Each row
is one test in `tests/reliability/` (or `bench/service/load.py`) with the figure it measured on its
last recorded run. Regenerate everything with `make test-reliability` (runs every reliability
test, the slow ones too, and the load bench, then rewrites this file); `make reliability-report`
rewrites the file from the recorded figures only. `make test` (CI) runs all of these tests
except the ones marked slow, so a broken promise fails CI even when this table is not
regenerated.
"""


def records() -> list[dict[str, Any]]:
    rows = [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))]
    return sorted(rows, key=lambda r: (AREA_ORDER.index(r["area"]) if r["area"] in AREA_ORDER
                                       else len(AREA_ORDER), r["key"]))


def latest_load() -> dict[str, Any] | None:
    if not LOAD.exists():
        return None
    rows = [json.loads(line) for line in LOAD.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if not r.get("quick")]
    return rows[-1] if rows else None


def load_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for bench/service/load.py's latest run: API latency and training slowdown under polling
    clients, and the SSE watchers (field meanings: the docstring of bench/service/load.py)."""
    setup, targets = result.get("setup", {}), result.get("targets", {})
    poll, closed, sse = result.get("poll", {}), result.get("closed", {}), result.get("sse", {})
    load = result.get("load_average", {})
    where = f"{result.get('machine', {}).get('cores', '?')} cores, load {load.get('start', ['?'])[0]}-{load.get('end', ['?'])[0]}"
    common = {"area": "load", "test": "bench/service/load.py", "measured_at": result.get("when", "-"), "machine": where}
    get_job, training = poll.get("get_job", {}), poll.get("training", {})
    stress = closed.get("get_job", {})
    rows = [
        {**common,
         "check": (f"{setup.get('queued_jobs', '?'):,} jobs queued, {setup.get('clients', '?')} clients polling "
                   f"GET /v1/jobs/{{id}} and its new metrics every {setup.get('interval_s', '?')} s while a job trains: "
                   "GET /v1/jobs/{id} p99 <= 50 ms"),
         "figure": (f"p99 {get_job.get('p99_ms')} ms (p50 {get_job.get('p50_ms')} ms, per round "
                    f"{get_job.get('p99_ms_per_round')}), {poll.get('requests_served', '?')} requests, "
                    f"statuses {get_job.get('status_codes')}; closed loop (no sleep) p99 {stress.get('p99_ms')} ms "
                    f"at {stress.get('req_per_s')} GET/s"),
         "passed": targets.get("get_job_p99_ms<=50") == "pass"},
        {**common,
         "check": "same load: the training job's throughput drops <= 5%",
         "figure": (f"drop {100 * training.get('drop', float('nan')):.1f}% (loaded/idle per round "
                    f"{training.get('ratio_per_round')}); closed loop drop "
                    f"{100 * closed.get('training', {}).get('drop', float('nan')):.1f}%"),
         "passed": targets.get("training_drop<=0.05") == "pass"},
    ]
    if sse:
        rows.append({**common,
                     "check": f"{setup.get('sse_watchers', '?')} SSE watchers on one running job: every step, worker not slowed",
                     "figure": (f"{sse.get('complete')}/{sse.get('watchers')} watcher-phases got every loss step once "
                                f"({sse.get('gaps')} gaps, {sse.get('repeats')} repeats); training loaded/idle "
                                f"{sse.get('training', {}).get('ratio')}"),
                     "passed": targets.get("sse_all_steps") == "pass"})
    return rows


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(rows: list[dict[str, Any]]) -> str:
    lines = [HEADER, "| Area | Check | Measured | Held | Test | Measured at (machine) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        held = "yes" if r["passed"] else "**no**"
        lines.append(
            f"| {cell(r['area'])} | {cell(r['check'])} | {cell(r['figure'])} | {held} | "
            f"`{cell(r['test'])}` | {cell(r.get('measured_at', '-'))} ({cell(r.get('machine', '-'))}) |"
        )
    if not rows:
        lines.append("| - | nothing recorded yet: run `make test-reliability` | - | - | - | - |")
    failed = [r for r in rows if not r["passed"]]
    lines += ["", f"{len(rows)} checks recorded, {len(rows) - len(failed)} held."]
    notes = ROOT / "docs" / "reliability-notes.md"
    if notes.exists():
        lines += ["", notes.read_text().strip()]
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = records()
    load = latest_load()
    if load is not None:
        rows += load_rows(load)
    DOC.write_text(render(rows))
    print(f"wrote {DOC.relative_to(ROOT)}: {len(rows)} rows")


if __name__ == "__main__":
    main()
