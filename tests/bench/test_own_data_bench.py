"""bench/service/own_data.py in --quick mode: it runs end to end and prints its figures as JSON, with
accumcore exact on the short last window (the peer part is reported as not measured)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_prints_the_figures() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "bench.service.own_data", "--quick", "--threads", "1"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["bench"] == "own_data" and row["quick"] is True
    assert row["imagefolder"]["samples_per_s"]["accum"] > 0 and row["imagefolder"]["samples_per_s"]["plain"] > 0
    assert row["gpt2_tokens"]["tokens_per_s"]["accum"] > 0
    assert row["short_last_window_float64"]["accum_max_abs_diff"] <= 1e-12
