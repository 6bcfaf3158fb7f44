"""A job that kills its worker is stopped as `poison`, not restarted until max_restarts: the
worker running it is SIGKILLed at the same step twice (as the kernel's OOM killer would), and
the job ends failed with reason poison and the last known cause, without a third attempt.
Real worker processes, SQLite and PostgreSQL + Redis.

    .venv/bin/python -m pytest tests/reliability/test_poison_job.py -q
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

STEP = 5  # each attempt is killed once it has reported this optimizer step
SPEC = {"max_steps": 10_000_000, "checkpoint_every": 10_000_000, "max_restarts": 10}
LEASES = {"lease_timeout_s": 2.0, "heartbeat_interval_s": 0.5, "reaper_interval_s": 0.2}


def kill_at_step(stack: Any, job_id: str, attempt: int) -> int:
    job = stack.wait(job_id, ("running",), timeout=180, check=lambda j: j.attempts == attempt
                     and (j.progress or {}).get("optimizer_step", 0) >= STEP)
    victim = stack.process_holding(job_id)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    return int(job.progress["optimizer_step"])


def test_a_job_killing_its_worker_twice_at_the_same_step_ends_as_poison(
    stack: Any, tmp_path: Path, record_figure: Any
) -> None:
    own = stack.variant(tmp_path, **LEASES)
    own.start_worker()
    try:
        job_id = own.create(**SPEC)
        first = kill_at_step(own, job_id, 1)
        own.start_worker()  # the replacement takes the re-queued job
        second = kill_at_step(own, job_id, 2)
        own.start_worker()  # would take a third attempt, if there were one
        job = own.wait(job_id, timeout=60)
        marker = own.create(max_steps=1)  # the spare is up and consuming: it ran this
        assert own.wait(marker, timeout=120).status == "succeeded", own.worker_logs()
        job = own.job(job_id)
        kinds = own.event_kinds(job_id)
    finally:
        own.stop_workers()
    assert job.status == "failed", (job.status, job.error, own.worker_logs())
    assert job.error["type"] == "PoisonJob" and job.error["reason"] == "poison"
    message = job.error["message"]
    assert "2 attempts in a row died without writing a checkpoint" in message
    assert f"at optimizer step {second}" in message and "its last event:" in message
    assert f"POST /v1/jobs/{job_id}/resume" in message
    assert job.attempts == 2 and job.restarts == 1 < job.max_restarts
    assert kinds.count("started") == 2 and kinds.count("lease_expired") == 2
    assert kinds[-1] == "failed"
    record_figure(
        f"poison_{stack.name}", area="fault",
        check=f"Worker SIGKILLed at step >= {STEP} in two attempts in a row, no checkpoint "
        f"between (max_restarts {SPEC['max_restarts']}), {stack.name}",
        figure=f"killed at steps {first} and {second}; job {job.status} with reason "
        f"{job.error['reason']} after {job.attempts} attempts ({job.restarts} restart of "
        f"{job.max_restarts}), no third attempt",
        passed=job.error["reason"] == "poison" and job.attempts == 2,
    )
