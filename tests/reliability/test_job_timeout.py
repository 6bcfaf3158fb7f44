"""A job's `timeout` is its run time over all its attempts: a job handed back half way through
its timeout (its worker stopped with SIGTERM) gets only the remainder on the next worker, then
is checkpointed and fails with reason `timeout`; a resume with a new timeout continues it.
Real worker processes, SQLite and PostgreSQL + Redis.

    .venv/bin/python -m pytest tests/reliability/test_job_timeout.py -q
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from services.jobdb import checkpoints, jobs
from services.jobdb.types import utcnow

TIMEOUT_S = 8
SPEC = {"max_steps": 10_000_000, "checkpoint_every": 10_000_000, "timeout": TIMEOUT_S}


@pytest.mark.slow
def test_a_second_attempt_runs_only_what_is_left_of_the_timeout(
    stack: Any, tmp_path: Path, record_figure: Any
) -> None:
    own = stack.variant(tmp_path)
    first = own.start_worker()
    try:
        job_id = own.create(**SPEC)
        # Stopped once the attempt has used half the timeout (read from its own start time).
        own.wait(job_id, ("running",), timeout=120, check=lambda job: job.started_at is not None
                 and (utcnow() - job.started_at).total_seconds() >= TIMEOUT_S / 2)
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
        handed_back = own.job(job_id)
        own.start_worker()
        job = own.wait(job_id, timeout=120)
        with own.sessions() as session:
            attempts = [(a.ended_at - a.started_at).total_seconds()
                        for a in jobs.load_job(session, job_id).attempt_list]  # type: ignore[union-attr]
            kept = [c.step for c in checkpoints.list_checkpoints(session, job_id)]
        own.resume(job_id)  # the resume counts from 0 again: it runs, and times out again
        again = own.wait(job_id, timeout=120, check=lambda j: j.attempts == 3)
    finally:
        own.stop_workers()
    assert handed_back.status == "queued" and handed_back.run_seconds >= TIMEOUT_S / 2
    assert job.status == "failed" and job.error["reason"] == "timeout", (job.error, own.worker_logs())
    assert job.attempts == 2 and kept[-1] == job.progress["optimizer_step"]
    assert job.progress["optimizer_step"] > (handed_back.resume_step or 0)
    # Stopped once the two attempts together reached the timeout, not a whole timeout later.
    assert TIMEOUT_S <= job.run_seconds < handed_back.run_seconds + TIMEOUT_S
    assert again.error["reason"] == "timeout" and again.progress["optimizer_step"] > job.progress["optimizer_step"]
    record_figure(
        f"timeout_over_attempts_{stack.name}", area="limits",
        check=f"timeout {TIMEOUT_S} s; the first worker SIGTERMed after half of it, a second "
        f"worker resumes the job, {stack.name}",
        figure=f"attempts ran {attempts[0]:.1f} s + {attempts[1]:.1f} s = {job.run_seconds:.1f} s "
        f"counted; failed with reason {job.error['reason']}, checkpointed at step {kept[-1]}; "
        "a resume ran and timed out again from there",
        passed=job.error["reason"] == "timeout" and job.run_seconds < handed_back.run_seconds + TIMEOUT_S,
    )
