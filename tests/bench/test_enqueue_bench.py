"""bench/service/enqueue.py runs end to end in --quick mode on the real Redis and prints one JSON row:
both paths published every message it timed, and each figure is a positive ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_enqueue_bench_quick_run_publishes_every_message(redis_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "ACCUM_TEST_REDIS_URL": redis_url,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "bench.service.enqueue", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    # --out (what bench/run_all.py passes) appends the same object as one row.
    assert [json.loads(line) for line in (tmp_path / "enqueue.jsonl").read_text().splitlines()] == [row]
    sent = row["rounds"] * row["messages_per_round"] + 20  # + the warm-up
    assert row["published"] == [sent, sent]
    assert row["cpu_ratio"] > 0 and row["wall_ratio"] > 0
    assert len(row["runs"]) == row["rounds"]
