"""kill -9 a worker mid-job: another worker's reaper re-queues the job once its lease expires,
and the job resumes from its latest checkpoint to the same final weights as an uninterrupted
run, with every metric step exactly once. Real processes, SQLite and PostgreSQL + Redis."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from sqlalchemy import select
from worker_stack import weight_differences

from services.jobdb import checkpoints
from services.jobdb.models import JobAttempt

SPEC = {"max_steps": 200, "checkpoint_every": 5, "keep_checkpoints": 3, "micro_batch_size": 32,
        "accumulation_steps": 2}


def wait_for_first_checkpoint(stack: Any, job_id: str, timeout: float = 90.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with stack.sessions() as session:
            kept = checkpoints.list_checkpoints(session, job_id)
        if kept:
            return kept[-1].step
        time.sleep(0.005)
    raise AssertionError(f"no checkpoint after {timeout}s\n{stack.worker_logs()}")


def test_killed_worker_job_resumes_from_checkpoint_to_identical_weights(stack: Any) -> None:
    # A second worker on the queue; whichever takes the job is killed, the other resumes it.
    stack.start_worker()
    job_id = stack.create(**SPEC)
    step_at_kill = wait_for_first_checkpoint(stack, job_id)
    victim = stack.process_holding(job_id)
    victim_name = next(name for name, process in stack.hostnames.items() if process is victim)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    progress = stack.job(job_id).progress["optimizer_step"]
    assert stack.job(job_id).status == "running" and progress < SPEC["max_steps"], (
        "the job finished before the kill; make SPEC longer"
    )

    # The survivor's reaper finds the expired lease and re-queues the job; it resumes there.
    job = stack.wait(job_id, timeout=120)
    assert job.status == "succeeded", (job.error, stack.worker_logs())
    assert job.attempts == 2 and job.restarts == 1
    kinds = stack.event_kinds(job_id)
    assert kinds.count("started") == 2 and "lease_expired" in kinds and "requeued" in kinds
    assert job.resume_step is not None and job.resume_step >= step_at_kill

    steps = stack.metric_steps(job_id)
    assert [step for step, _ in steps] == list(range(1, SPEC["max_steps"] + 1))
    # Steps after the resume point were (re)written by the second attempt.
    assert {attempt for step, attempt in steps if step > job.resume_step} == {2}
    # The job's record: the killed worker's attempt lost, the survivor's resumed and succeeded.
    with stack.sessions() as session:
        first, second = session.scalars(
            select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.attempt)
        ).all()
    assert (first.worker, first.outcome, first.resume_step) == (victim_name, "lost", None)
    assert first.end_step is not None and first.end_step >= step_at_kill
    assert second.worker != victim_name and second.worker == job.worker_name
    assert (second.outcome, second.resume_step) == ("succeeded", job.resume_step)
    assert second.end_step == SPEC["max_steps"] and first.ended_at <= second.started_at

    reference_id = stack.create(**SPEC)  # the same spec and seed, never interrupted
    reference = stack.wait(reference_id, timeout=120)
    assert reference.status == "succeeded" and reference.attempts == 1
    assert not weight_differences(stack.final_weights(job_id), stack.final_weights(reference_id))
