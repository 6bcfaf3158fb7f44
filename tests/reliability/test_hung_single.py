"""A ``gpus: 1`` job trains in its worker's process (docs/architecture.md, "One supervisor":
measured, a spawned rank per job would cost the suite more than it gives), so stopping its
training (SIGSTOP) stops the worker with it, its lease heartbeat too: the lease expires after
ACCUM_LEASE_TIMEOUT_S and another worker's reaper closes the attempt ``lost`` and re-queues the
job; it resumes from its last checkpoint on the other worker, every step once. Held at a known
step (tests/held_jobs.py) so the stop lands mid-job."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from held_jobs import Hold
from worker_stack import Stack

from services.jobdb.models import JobAttempt

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("stack", ["postgres_redis"], indirect=True)]

LEASE_TIMEOUT_S = 5.0
STEPS, HOLD_STEP, CHECKPOINT = 10, 4, 3
SPEC = {"micro_batch_size": 16, "accumulation_steps": 2, "max_steps": STEPS, "checkpoint_every": CHECKPOINT,
        "keep_checkpoints": 2, "max_restarts": 3, "gpus": 1, "dataset": Hold.dataset(HOLD_STEP, micro_batches=2)}


def test_a_stopped_gpus_1_job_resumes_on_another_worker(stack: Stack, tmp_path: Path) -> None:
    hold = Hold(tmp_path / "gate")
    own = stack.variant(tmp_path, lease_timeout_s=LEASE_TIMEOUT_S, heartbeat_interval_s=0.5, reaper_interval_s=0.5)
    for _ in range(2):
        own.start_worker(**hold.env())
    stopped: int | None = None
    try:
        job_id = hold.create(own, **SPEC)
        hold.wait_held(own, job_id, processes=1, step=HOLD_STEP, checkpoint=CHECKPOINT)
        stopped = own.process_holding(job_id).pid
        os.kill(stopped, signal.SIGSTOP)  # its training, its heartbeat and its reaper
        at = time.monotonic()
        hold.release()
        own.wait(job_id, ("queued", "running", "succeeded"), timeout=120,
                 check=lambda j: "lease_expired" in own.event_kinds(job_id))
        noticed_s = time.monotonic() - at
        job = own.wait(job_id, timeout=180)
        assert noticed_s <= LEASE_TIMEOUT_S + 10, noticed_s
        assert job.status == "succeeded", (job.error, own.worker_logs())
        with own.sessions() as session:
            first = session.query(JobAttempt).filter_by(job_id=job_id, attempt=1).one()
        assert first.outcome == "lost" and first.ended_at is not None
        assert [s for s, _ in own.metric_steps(job_id)] == list(range(1, STEPS + 1))  # each once
    finally:
        hold.release()
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        own.stop_workers()
