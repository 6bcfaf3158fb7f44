"""kill -9 a worker mid-job: another worker's reaper re-queues the job once its lease expires,
and the job resumes from its latest checkpoint to the same final weights as an uninterrupted
run, with every metric step exactly once. Real processes, SQLite and PostgreSQL + Redis."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch

from services.store import checkpoints, metrics

SPEC = {"max_steps": 200, "checkpoint_every": 5, "keep_checkpoints": 3, "micro_batch_size": 32,
        "accumulation_steps": 2}


def final_model(stack: Any, job_id: str) -> dict[str, torch.Tensor]:
    with stack.sessions() as session:
        latest = checkpoints.latest_checkpoint(session, job_id)
    assert latest is not None and latest.step == SPEC["max_steps"]
    return dict(torch.load(Path(latest.uri), weights_only=True)["model"])


def wait_for_first_checkpoint(stack: Any, job_id: str, timeout: float = 90.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with stack.sessions() as session:
            latest = checkpoints.latest_checkpoint(session, job_id)
        if latest is not None:
            return latest.step
        time.sleep(0.005)
    raise AssertionError(f"no checkpoint after {timeout}s\n{stack.worker_logs()}")


def test_killed_worker_job_resumes_from_checkpoint_to_identical_weights(stack: Any) -> None:
    # A second worker on the queue; whichever takes the job is killed, the other resumes it.
    stack.start_worker()
    job_id = stack.create(**SPEC)
    step_at_kill = wait_for_first_checkpoint(stack, job_id)
    victim = stack.process_holding(job_id)
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

    with stack.sessions() as session:
        rows, _ = metrics.read_metrics(session, job_id, name="loss", limit=100_000)
    assert [r.step for r in rows] == list(range(1, SPEC["max_steps"] + 1))
    # Steps after the resume point were (re)written by the second attempt.
    assert {r.attempt for r in rows if r.step > job.resume_step} == {2}

    reference_id = stack.create(**SPEC)  # the same spec and seed, never interrupted
    reference = stack.wait(reference_id, timeout=120)
    assert reference.status == "succeeded" and reference.attempts == 1
    resumed, uninterrupted = final_model(stack, job_id), final_model(stack, reference_id)
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in uninterrupted.items():
        assert torch.equal(resumed[name], tensor), f"parameter {name} differs after resume"
