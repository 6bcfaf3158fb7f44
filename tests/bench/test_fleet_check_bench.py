"""bench/service/fleet_check.py runs in --quick mode on SQLite and prints one JSON row whose
figure compares the API's kept fleet view with a fresh registry read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fleet_check_bench_prints_its_figure() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.service.fleet_check", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=300).stdout
    row = json.loads(out.strip().splitlines()[-1])
    assert row["bench"] == "fleet_check" and row["quick"] is True
    assert set(row["workers"]) == {"0", "8", "64"} and row["database"] == "sqlite"
    assert all(v["kept_cpu_ms"] > 0 and v["fresh_cpu_ms"] > 0 for v in row["workers"].values())
    assert row["measured"] == row["workers"]["64"]["ratio"]
