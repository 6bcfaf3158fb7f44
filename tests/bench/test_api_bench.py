"""bench/service/api.py runs end to end in --quick mode (real uvicorn, PostgreSQL, Redis) and prints
one JSON row with every figure, so the benchmark cannot silently rot."""

from __future__ import annotations

from pathlib import Path

import pytest
from quick_bench import run_quick_bench

from bench import run_all


@pytest.mark.slow
def test_api_bench_quick_run_reports_every_figure(
    postgres_server_url: str, redis_url: str, tmp_path: Path
) -> None:
    result = run_quick_bench(
        "api", postgres_server_url,
        # Its own Redis database: the bench flushes it.
        {"ACCUM_BENCH_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/12"},
        tmp_path,
    )
    assert result["machine"]["cores"] >= 1
    for phase in ("submit_closed_loop", "submit_at_300_rps", "submit_at_half_capacity"):
        assert set(result[phase]["status_codes"]) == {"201"}, phase
        assert result[phase]["p99_ms"] >= result[phase]["p50_ms"] > 0
    assert result["metrics_page"]["first"]["points"] == 1000
    assert 250 <= result["metrics_downsampled"]["points"] <= 500
    assert result["startup"]["torch_imported"] is False
    assert set(result["targets"].values()) <= {"pass", "miss"}
    # Open loop: every request was offered on schedule, at the target rate.
    assert result["submit_at_300_rps"]["offered_req_per_s"] == 300
    assert result["submit_at_300_rps"]["connections"] >= 32

    # The docs table shows its figures (value, target, verdict), not a pointer to the file.
    rows = run_all.api_rows(result)
    assert len(rows) == len(result["targets"]) + 1  # + the CPU per POST, shown
    p99_row = rows[0]
    assert p99_row[1:] == (
        "<= 25",
        run_all._fmt(result["submit_at_300_rps"]["p99_ms"]),
        result["targets"]["submit_p99_ms_at_300_rps<=25"],
    )
    assert not any("see bench/results" in cell for row in rows for cell in row)
    assert rows[-1][2] == "no"  # torch not imported
