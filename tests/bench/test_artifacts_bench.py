"""bench/service/artifacts.py runs end to end in a small mode and prints one JSON object with the
upload, fetch and (with a few steps) throughput figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_artifacts_bench_prints_its_figures(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.service.artifacts", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    # --out (what bench/run_all.py passes) appends the same object as one row.
    assert [json.loads(row) for row in (tmp_path / "artifacts.jsonl").read_text().splitlines()] == [figures]
    assert figures["quick"] is True
    store = figures["store"]
    assert set(store["upload_mb_per_s"]) == {"local_file", "obstore", "obstore_writer_sha", "s3fs"}
    assert all(v > 0 for v in store["upload_mb_per_s"].values())
    assert store["fetch_s"]["cold"] > 0 and store["fetch_s"]["warm"] > 0
    assert figures["throughput"]["ratio_checkpointed_over_none"] > 0
    assert figures["throughput"]["target"] == 0.95
