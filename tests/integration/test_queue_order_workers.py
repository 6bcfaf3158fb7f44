"""Queue order with real workers: on Redis one busy worker takes the jobs queued behind its
job high, normal, low (not in the order they were sent); with
ACCUM_MAX_RUNNING_JOBS_PER_OWNER=1 two workers never run one owner's two jobs at once, and
run another owner's job meanwhile."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from worker_stack import BASE_SPEC, Stack, make_stack

from services.dispatch.enqueue import enqueue_job
from services.jobdb import jobs, tokens
from services.jobdb.models import JobAttempt, Owner
from services.jobdb.queue_order import PRIORITIES
from services.spec import parse_spec, total_optimizer_steps

LONG = {"max_steps": 1000, "checkpoint_every": 10000}


def submit(stack: Stack, owner: Owner, priority: str = "normal", **spec: Any) -> str:
    """A job of ``owner`` on the stack's queue, sent at its priority (as the API does)."""
    parsed = parse_spec({**BASE_SPEC, **spec, "priority": priority, "queue": stack.queue})
    with stack.sessions.begin() as session:
        job, _ = jobs.create_job(
            session, owner=owner, spec=parsed.normalised(), queue=stack.queue,
            total_optimizer_steps=total_optimizer_steps(parsed), priority=PRIORITIES[priority],
        )
    enqueue_job(stack.settings, job.id, stack.queue, PRIORITIES[priority])
    return job.id


def new_owner(stack: Stack) -> Owner:
    with stack.sessions.begin() as session:
        owner, _ = tokens.create_owner_with_token(session, f"qo-{uuid.uuid4().hex[:8]}")
    return owner


def attempts(stack: Stack, job_id: str) -> list[JobAttempt]:
    with stack.sessions() as session:
        return list(session.scalars(
            select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.attempt)
        ))


def test_one_redis_worker_takes_queued_jobs_by_priority(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    stack = make_stack("postgres_redis", tmp_path, request)
    stack.start_worker()
    try:
        owner = new_owner(stack)
        blocker = submit(stack, owner, **LONG)
        stack.wait(blocker, ("running",), timeout=240)
        queued = {p: submit(stack, owner, p, max_steps=2) for p in ("low", "normal", "high")}
        for job_id in [blocker, *queued.values()]:
            assert stack.wait(job_id, timeout=240).status == "succeeded", stack.worker_logs()
        starts = {p: attempts(stack, job_id)[0].started_at for p, job_id in queued.items()}
        assert starts["high"] < starts["normal"] < starts["low"], starts
        assert attempts(stack, blocker)[0].ended_at <= starts["high"]
    finally:
        stack.stop_workers()


def test_the_running_cap_keeps_an_owner_to_one_job_at_a_time_per_queue(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capped = stack.variant(tmp_path)
    monkeypatch.setenv("ACCUM_MAX_RUNNING_JOBS_PER_OWNER", "1")
    capped.start_worker()
    capped.start_worker()
    try:
        alice, bob = new_owner(capped), new_owner(capped)
        first = submit(capped, alice, **LONG)
        capped.wait(first, ("running",), timeout=240)
        second = submit(capped, alice, max_steps=2)
        bobs = submit(capped, bob, max_steps=2)
        # bob's job runs beside alice's first on the other worker; alice's second waits.
        assert capped.wait(bobs, timeout=240).status == "succeeded", capped.worker_logs()
        assert capped.job(first).status == "running", "make LONG longer: it ended before bob's"
        assert capped.job(second).status == "queued"
        for job_id in (first, second):
            assert capped.wait(job_id, timeout=240).status == "succeeded", capped.worker_logs()
        (a1,), (a2,) = attempts(capped, first), attempts(capped, second)
        assert a1.ended_at is not None and a2.started_at >= a1.ended_at
    finally:
        capped.stop_workers()
