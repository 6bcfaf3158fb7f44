"""Figures of the reliability tests, for docs/reliability.md.

A reliability test states what it measured with ``record_figure(...)`` (the fixture in
conftest.py). Under ``ACCUM_RECORD_RELIABILITY=1`` (set by ``make test-reliability``) each
figure is written to ``bench/results/reliability/<key>.json``; otherwise nothing is written,
so `make test` leaves the tree clean. ``tools/reliability_report.py`` turns the files into
the table in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "reliability"
AREAS = ("fault", "bad input", "auth", "limits", "load")


def recording() -> bool:
    return os.environ.get("ACCUM_RECORD_RELIABILITY", "") not in ("", "0", "false", "no")


def record_figure(key: str, *, area: str, check: str, figure: str, passed: bool, test: str) -> None:
    """Keep one row of the reliability table: `check` (what was done), `figure` (what was
    measured, e.g. "10/10 resumed, 0 steps lost"), whether the promise held."""
    if area not in AREAS:
        raise ValueError(f"area must be one of {AREAS}, got {area!r}")
    if not recording():
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    row = {
        "key": key, "area": area, "check": check, "figure": figure, "passed": passed,
        "test": test, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    (RESULTS / f"{key}.json").write_text(json.dumps(row, indent=1) + "\n")
