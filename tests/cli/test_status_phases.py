"""`accum status`: a finished job's time to a tenth of a second and where its last attempt's
time went (the API's `attempts[-1].phases`)."""

from __future__ import annotations

from typing import Any

from services.cli.jobs import describe_job


def job(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "01J", "name": "digits", "status": "succeeded", "queue": "default",
        "spec": {"model": {"name": "small_cnn"}, "dataset": {"name": "digits"}, "epochs": 2},
        "progress": {"optimizer_step": 46, "total_optimizer_steps": 46, "epoch": 1},
        "created_at": "2026-12-04T10:00:00.000Z", "started_at": "2026-12-04T10:00:00.020Z",
        "finished_at": "2026-12-04T10:00:01.320Z",
        "attempts": [{"attempt": 1, "started_at": "2026-12-04T10:00:00.020Z",
                      "phases": {"claim": 0.012, "build": 0.21, "checks": 0.05, "train": 0.9,
                                 "final_writes": 0.04, "finish": 0.006}}],
    }
    return {**base, **changes}


def test_status_shows_took_and_the_phases_in_order() -> None:
    fields = dict(describe_job(job()))
    assert fields["took"] == "1.3 s"
    assert fields["phases"] == ("queued 0.02 s, claim 0.01 s, build 0.21 s, checks 0.05 s, train 0.90 s, "
                                "final writes 0.04 s, finish 0.01 s")


def test_status_of_a_job_from_a_worker_that_timed_nothing_has_no_phases_line() -> None:
    attempts = [{"attempt": 1, "started_at": "2026-12-04T10:00:00.020Z", "phases": None}]
    fields = dict(describe_job(job(attempts=attempts, finished_at="2026-12-04T10:03:00Z")))
    assert "phases" not in fields and fields["took"] == "3 min 00 s"
