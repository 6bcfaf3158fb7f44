"""bench/service/spec_limits.py runs in --quick mode and prints one JSON object with a figure
per spec, so the benchmark cannot silently rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_spec_limits_bench_quick_run_reports_each_spec(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "service" / "spec_limits.py"), "--quick", "--repeats", "2",
         "--out", str(tmp_path)],
        capture_output=True, text=True, check=True, env=env, timeout=120,
    )
    result = json.loads(out.stdout)
    # --out (what bench/run_all.py passes) appends the same object as one row.
    assert [json.loads(row) for row in (tmp_path / "spec_limits.jsonl").read_text().splitlines()] == [result]
    assert result["bench"] == "spec_limits" and result["quick"] is True
    assert set(result["specs"]) == {"mlp-digits", "resnet50-fake", "tiny_transformer-text"}
    for row in result["specs"].values():
        assert row["parse_spec_us"] > 0 and row["limit_errors_us"] > 0
        assert row["ratio_limits_to_parse"] > 0
