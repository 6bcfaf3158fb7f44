"""The suite's time, from a record of one full run (``make test`` writes build/test-durations.json).

    python tools/durations_report.py [RECORD]   # keep RECORD, rewrite docs/development.md
    python tools/durations_report.py --no-copy  # rewrite the doc from the kept record

Keeps the record as bench/results/test_durations.json (every test: seconds, CPU seconds, lane,
xdist worker, outcome) and rewrites the section of docs/development.md between its markers:
the run's commit, wall and CPU seconds, load, where the time goes by folder and lane, and the
slowest tests. ``tests/test_durations_doc.py`` checks the doc is the kept record's rendering.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECORD = ROOT / "build" / "test-durations.json"
KEPT = ROOT / "bench" / "results" / "test_durations.json"
DOC = ROOT / "docs" / "development.md"
START, END = "<!-- test-durations:start -->", "<!-- test-durations:end -->"
SLOWEST = 15


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(round(seconds % 60)):02d} s"


def folder(test: str) -> str:
    parts = test.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def render(record: dict[str, Any]) -> str:
    tests = record["tests"]
    outcomes: dict[str, int] = defaultdict(int)
    for row in tests:
        outcomes[row["outcome"]] += 1
    summed = sum(r["seconds"] for r in tests)
    lines = [
        START,
        "<!-- written by tools/durations_report.py from bench/results/test_durations.json -->",
        "",
        f"Last recorded full run (`make test`): commit `{record['commit']}`, {record['started']}, "
        f"{record['workers']} xdist worker(s) on {record['cores']} cores: **{minutes(record['wall_seconds'])}** "
        f"wall, {record['cpu_seconds']:.0f} CPU-s (user + sys, children included), "
        f"load average {record['load_at_start'][0]:.2f} at the start and {record['load_at_end'][0]:.2f} "
        f"at the end; {len(tests)} tests: "
        + ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items()))
        + f". The tests' own seconds add up to {summed:.0f} s.",
        "",
        "| folder | tests | seconds | CPU-s | share of the summed seconds |",
        "|---|---:|---:|---:|---:|",
    ]
    by_folder: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    by_lane: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for row in tests:
        for key, table in ((folder(row["test"]), by_folder), (row["lane"], by_lane)):
            table[key][0] += 1
            table[key][1] += row["seconds"]
            table[key][2] += row["cpu_seconds"]
    for name, (count, seconds, cpu) in sorted(by_folder.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| `{name}` | {count:.0f} | {seconds:.0f} | {cpu:.0f} | {100 * seconds / summed:.1f} % |")
    for name, (count, seconds, cpu) in sorted(by_lane.items()):
        lines.append(f"| lane: {name} | {count:.0f} | {seconds:.0f} | {cpu:.0f} | {100 * seconds / summed:.1f} % |")
    lines += ["", f"The {SLOWEST} slowest tests (setup, call and teardown):", "",
              "| test | seconds | CPU-s | lane |", "|---|---:|---:|---|"]
    for row in tests[:SLOWEST]:
        lines.append(f"| `{row['test']}` | {row['seconds']:.1f} | {row['cpu_seconds']:.1f} | {row['lane']} |")
    lines += ["", END]
    return "\n".join(lines)


def rewritten(doc: str, record: dict[str, Any]) -> str:
    if START not in doc or END not in doc:
        raise SystemExit(f"{DOC} has no {START} ... {END} section to rewrite")
    before, rest = doc.split(START, 1)
    _, after = rest.split(END, 1)
    return before + render(record) + after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("record", nargs="?", type=Path, default=DEFAULT_RECORD)
    parser.add_argument("--no-copy", action="store_true", help="render the kept record only")
    args = parser.parse_args(argv)
    if not args.no_copy:
        if not args.record.exists():
            print(f"no record at {args.record}: run `make test` first", file=sys.stderr)
            return 2
        shutil.copyfile(args.record, KEPT)
    record = json.loads(KEPT.read_text())
    DOC.write_text(rewritten(DOC.read_text(), record))
    print(f"{DOC.relative_to(ROOT)}: {minutes(record['wall_seconds'])} at commit {record['commit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
