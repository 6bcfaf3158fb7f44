"""A ``gpus: 1`` job trains in its worker's process (docs/architecture.md, "One supervisor":
measured, a spawned rank per job would cost the suite more than it gives), in a thread its
worker watches as it watches spawned ranks (services.worker.pulse.run_here).

- Its dataset blocks mid-job (held at a known step: tests/held_jobs.py, never released) while
  the worker's heartbeat keeps the lease: the thread's beats stop, and its worker ends the
  attempt ``hung`` within ACCUM_COLLECTIVE_TIMEOUT_S + 10 s, with an event naming node 0, rank 0
  and the process; the job resumes from its last checkpoint, every step once. The process that
  holds the stuck thread takes no other job: a prefork child ends after its job (the worker's
  pool starts a fresh one, which resumes it); a solo worker exits with code 75 (its supervisor
  restarts it; here another worker resumes the job).
- Stopping the whole process (SIGSTOP) stops the worker with it, its lease heartbeat too: the
  lease expires after ACCUM_LEASE_TIMEOUT_S and another worker's reaper closes the attempt
  ``lost`` and re-queues the job; it resumes from its last checkpoint on the other worker, every
  step once. Held at a known step so the stop lands mid-job."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from held_jobs import Hold
from worker_stack import Stack

from services.jobdb.events import list_events
from services.jobdb.models import JobAttempt

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("stack", ["postgres_redis"], indirect=True)]

LEASE_TIMEOUT_S = 5.0
COLLECTIVE_TIMEOUT_S = 5.0  # the hung deadline: 5 s + a margin of 2.5 s after the last beat
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


@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_a_gpus_1_job_whose_dataset_blocks_is_ended_hung_and_resumes(
    stack: Stack, tmp_path: Path, record_figure: Callable[..., None], pool: str,
) -> None:
    hold = Hold(tmp_path / "gate")
    own = stack.variant(tmp_path, heartbeat_interval_s=0.5, reaper_interval_s=0.5)
    env = {**hold.env(), "ACCUM_COLLECTIVE_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S)}
    # prefork: the pool replaces the child that held the stuck thread, and that worker resumes
    # the job; solo: the worker exits, and a second one resumes it.
    for _ in range(1 if pool == "prefork" else 2):
        own.start_worker(pool, **env)
    try:
        job_id = hold.create(own, **SPEC)
        hold.wait_held(own, job_id, processes=1, step=HOLD_STEP, checkpoint=CHECKPOINT)
        worker = own.process_holding(job_id)
        [stuck] = hold.held()  # the process whose training thread waits at the gate
        blocked_at = hold.gate.with_name(f"{hold.gate.name}.held.{stuck}").stat().st_mtime
        deadline = time.monotonic() + 120  # not own.wait: a solo worker's exit is expected here
        while "hung" not in own.event_kinds(job_id):
            assert time.monotonic() < deadline, own.worker_logs()
            time.sleep(0.05)
        caught_s = time.time() - blocked_at
        hold.release()  # for the resumed attempt (the stuck thread's process is ending)
        code = None
        if pool == "solo":
            code = worker.wait(timeout=60)
            own.workers.remove(worker)  # exited as it should; the other worker resumes the job
        job = own.wait(job_id, timeout=180)
        steps = [s for s, _ in own.metric_steps(job_id)]
        if pool == "prefork":
            assert worker.poll() is None, own.worker_logs()  # the pool's parent lives on
        record_figure(
            f"gpus_1_hung_{pool}", area="fault",
            check=f"gpus: 1 job whose dataset blocks mid-job, --pool {pool}, "
                  f"ACCUM_COLLECTIVE_TIMEOUT_S={COLLECTIVE_TIMEOUT_S:g}",
            figure=f"attempt ended hung {caught_s:.1f} s after the dataset blocked; job {job.status}, "
                   f"{len(steps)}/{STEPS} loss steps" + (f"; the solo worker exited {code}" if code is not None else ""),
            passed=caught_s <= COLLECTIVE_TIMEOUT_S + 10 and job.status == "succeeded"
            and steps == list(range(1, STEPS + 1)),
        )
        assert caught_s <= COLLECTIVE_TIMEOUT_S + 10, caught_s
        assert job.status == "succeeded" and job.restarts == 1, (job.error, own.worker_logs())
        assert steps == list(range(1, STEPS + 1))  # each once
        with own.sessions() as session:
            first = session.query(JobAttempt).filter_by(job_id=job_id, attempt=1).one()
            [hung] = [e for e in list_events(session, job_id, limit=1000) if e.kind == "hung"]
        assert first.outcome == "hung" and first.ended_at is not None
        assert hung.message.startswith(f"node 0 of 1: rank 0 (pid {stuck}, "), hung.message
        if pool == "solo":
            assert code == 75, own.worker_logs()  # shutdown.EXIT_ABANDONED: for its supervisor to restart it
        deadline = time.monotonic() + 30  # the prefork child ended after its job, its thread with it
        while Path(f"/proc/{stuck}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{stuck}").exists(), own.worker_logs()
    finally:
        hold.release()
        own.stop_workers()
