"""bench/trainer/exactness_check.py runs in --quick mode and prints one JSON object with its figures:
the check's cost in optimizer steps and as a share of the demo job, and the job ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_exactness_check_bench_prints_its_figures_in_quick_mode() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bench.trainer.exactness_check", "--quick", "--threads", "1", "--clock", "cpu"],
        capture_output=True, text=True, timeout=300, env=os.environ.copy(), check=False, cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    [line] = [row for row in completed.stdout.splitlines() if row.strip()]
    result = json.loads(line)
    assert result["bench"] == "exactness_check" and result["quick"] is True
    assert result["machine"]["clock"] == "cpu" and result["machine"]["torch_threads"] == 1
    for figure in ("check_over_step", "check_share_of_job", "job_time_ratio"):
        assert result[figure] > 0
    assert len(result["runs"]["check_ratios"]) == len(result["runs"]["job_ratios"]) == 2
    assert result["verdict"] in ("pass", "miss")
