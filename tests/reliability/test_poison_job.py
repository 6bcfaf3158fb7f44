"""A job that kills its worker is stopped as `poison`, not restarted until max_restarts: the
worker running it is SIGKILLed at the same step twice (as the kernel's OOM killer would), and
the job ends failed with reason poison and the last known cause, without a third attempt.
With ``--pool prefork`` the worker sees its job's child die: the cause (the signal; the
kernel's OOM killer when the cgroup's ``oom_kill`` counter rose) is on each attempt and in the
poison error. Real worker processes, SQLite and PostgreSQL + Redis.

    .venv/bin/python -m pytest tests/reliability/test_poison_job.py -q
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from services.jobdb.models import JobAttempt

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


@pytest.mark.slow
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


MEMORY_EVENTS = "low 0\nhigh 0\nmax 0\noom {kills}\noom_kill {kills}\noom_group_kill 0\n"


def kill_child_at_step(stack: Any, job_id: str, attempt: int,
                       before_kill: Callable[[], None] = lambda: None) -> int:
    job = stack.wait(job_id, ("running",), timeout=180, check=lambda j: j.attempts == attempt
                     and (j.progress or {}).get("optimizer_step", 0) >= STEP)
    child = stack.pool_child(job_id)
    before_kill()
    os.kill(child, signal.SIGKILL)
    return int(job.progress["optimizer_step"])


@pytest.mark.slow
def test_a_prefork_child_killed_twice_ends_poison_naming_how_it_died(
    stack: Any, tmp_path: Path, record_figure: Any
) -> None:
    events = tmp_path / "memory.events"  # stands for the worker's cgroup v2 memory.events
    events.write_text(MEMORY_EVENTS.format(kills=0))
    # The stack's usual lease (5 s): the worker reports the death within ~1 s (worker_lost_wait)
    # and expires the lease itself, before the reaper would see it expire.
    own = stack.variant(tmp_path, oom_events_file=events, reaper_interval_s=0.2)
    worker = own.start_worker(pool="prefork")
    try:
        job_id = own.create(**SPEC)
        first = kill_child_at_step(own, job_id, 1)
        # The second death is the kernel's OOM killer: it counts its kill in memory.events.
        second = kill_child_at_step(own, job_id, 2,
                                    lambda: events.write_text(MEMORY_EVENTS.format(kills=1)))
        job = own.wait(job_id, timeout=60)
        marker = own.create(max_steps=1)  # the same worker lives on and takes new jobs
        assert own.wait(marker, timeout=120).status == "succeeded", own.worker_logs()
        job = own.job(job_id)
        kinds = own.event_kinds(job_id)
        with own.sessions() as session:
            causes = session.execute(select(JobAttempt.attempt, JobAttempt.outcome, JobAttempt.cause)
                                     .where(JobAttempt.job_id == job_id)
                                     .order_by(JobAttempt.attempt)).all()
    finally:
        own.stop_workers()
    assert worker.returncode is not None  # stopped only by the teardown, never killed itself
    assert job.status == "failed", (job.status, job.error, own.worker_logs())
    assert job.error["reason"] == "poison" and job.attempts == 2
    oom = "out of memory (the kernel's OOM killer): killed by signal 9 (SIGKILL)"
    assert [tuple(row) for row in causes] == [
        (1, "lost", "killed by signal 9 (SIGKILL)"), (2, "lost", oom)]
    assert job.error["cause"] == oom
    assert job.error["message"].startswith(f"{oom} at optimizer step ")
    assert "twice without a new checkpoint" in job.error["message"]
    assert kinds.count("process_died") == 2 and kinds[-1] == "failed"
    record_figure(
        f"poison_cause_{stack.name}", area="fault",
        check=f"Prefork child SIGKILLed at step >= {STEP} twice (the second with the cgroup's "
        f"oom_kill counter raised), {stack.name}",
        figure=f"killed at steps {first} and {second}; job {job.status} ({job.error['reason']}) "
        f"after {job.attempts} attempts; causes recorded: {[row.cause for row in causes]}",
        passed=job.error["reason"] == "poison" and job.error["cause"] == oom,
    )
