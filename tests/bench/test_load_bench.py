"""bench/service/load.py runs end to end in --quick mode (PostgreSQL, Redis, a real uvicorn API and a
real worker training a job) and prints one JSON row with every figure, so the load benchmark
cannot silently rot."""

from __future__ import annotations

from pathlib import Path

import pytest
from quick_bench import run_quick_bench


@pytest.mark.slow
def test_load_bench_quick_run_reports_every_figure(
    postgres_server_url: str, redis_url: str, tmp_path: Path
) -> None:
    result = run_quick_bench(
        "load", postgres_server_url,
        # Its own Redis database: test sessions flush theirs (a lost message would stall the job).
        {"ACCUM_LOAD_BENCH_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/13"},
        tmp_path,
    )
    setup = result["setup"]
    for phase in ("poll", "closed"):
        figures = result[phase]
        for kind in ("get_job", "get_metrics"):
            # Every request answered, none refused: the API kept up with every client.
            assert set(figures[kind]["status_codes"]) == {"200"}, (phase, kind)
            assert figures[kind]["p99_ms"] >= figures[kind]["p95_ms"] >= figures[kind]["p50_ms"] > 0
        assert figures["requests_served"] == figures["get_job"]["requests"] + figures["get_metrics"]["requests"]
        assert figures["training"]["steps_per_s"][0] > 0
    # The 1 Hz clients polled about once a second each; the closed loop far more.
    polls = result["poll"]["get_job"]["requests"]
    assert polls <= setup["clients"] * (setup["seconds_per_phase"] + 1)
    assert result["closed"]["get_job"]["requests"] > polls
    assert result["sse"]["watchers"] == setup["sse_watchers"] == result["sse"]["complete"]
    assert result["sse"]["gaps"] == result["sse"]["repeats"] == 0
    assert result["idle"]["steps_per_s"][0] > 0
    assert set(result["targets"].values()) <= {"pass", "miss"}
    assert len(result["load_average"]["per_phase"]) == 4 * setup["rounds"]
