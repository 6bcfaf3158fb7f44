"""Run one attempt of a job: claim it, build it from its spec, train, record the outcome.

    run_job(settings, job_id, worker_name="accum@host")   # what the Celery task calls

The database decides who trains: the claim is one atomic UPDATE, and a message whose claim
fails (job cancelled, finished, or held by a live worker) is simply dropped. Failures are
final (a bad spec, a missing dataset, an exception in training fail the job with the error
and its traceback as an event): retrying them would fail the same way. Lost workers are the
lease reaper's business, not Celery's. A worker shutting down (SIGTERM) stops the job, which
is checkpointed where it stopped, and hands it back to the queue (``services.worker.shutdown``).
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from services.data_roots import require_allowed_data_root
from services.spec import JobSpec, parse_spec
from services.store.checkpoints import get_checkpoint, list_checkpoints
from services.store.events import add_event
from services.store.leases import claim_job, finish_job, hand_back_job, renew_lease
from services.store.metrics import delete_metrics_after
from services.store.queue_order import PRIORITIES, held_by_running_cap, next_in_line
from services.worker import shutdown
from services.worker.checkpoints import remove_orphans
from services.worker.db import session_factory
from services.worker.db_retry import retry_while_unreachable
from services.worker.enqueue import enqueue_job
from services.worker.heartbeat import Heartbeat

log = logging.getLogger(__name__)

TRACEBACK_LIMIT = 20_000  # characters kept in the traceback event
# What ``train`` returns when the worker is shutting down and the job, checkpointed where it
# stopped, goes back to the queue; ``run_job`` then returns "queued".
HANDED_BACK = "handed_back"


@dataclass(frozen=True)
class Attempt:
    """The claimed attempt: who runs it and where it starts."""

    job_id: str
    attempt: int
    worker_id: str
    resume_step: int | None
    spec: dict[str, Any]


def describe_gpu() -> str:
    """``cpu``, or the visible GPUs' names, e.g. ``2x NVIDIA H100 (CUDA_VISIBLE_DEVICES=0,1)``."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    label = f"{count}x {torch.cuda.get_device_name(0)}"
    return f"{label} (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else label


def claim(settings: Any, job_id: str, worker_name: str) -> Attempt | None:
    """Claim the job atomically; None means: drop the message."""
    # Unique per attempt: a heartbeat left over from an earlier attempt in this process can
    # never renew (or finish) the lease of this one.
    worker_id = f"{worker_name or socket.gethostname()}/{uuid.uuid4().hex[:8]}"
    with session_factory(settings).begin() as session:
        if held_by_running_cap(session, job_id, settings.max_running_jobs_per_owner):
            log.info("job %s waits: its owner runs ACCUM_MAX_RUNNING_JOBS_PER_OWNER jobs on its "
                     "queue already", job_id)
            return None
        job = claim_job(
            session, job_id, worker_id, socket.gethostname(), describe_gpu(), settings.lease_timeout_s,
            worker_name=worker_name or None,
        )
        if job is None:
            return None
        return Attempt(job.id, job.attempts, worker_id, job.resume_step, dict(job.spec))


def run_job(settings: Any, job_id: str, worker_name: str = "") -> str | None:
    """Run the job if it can be claimed; returns the final status, "queued" when the worker
    is shutting down and handed the job back, or None when the message was dropped (not
    claimable) or the lease was lost mid-run (someone else owns the job)."""
    attempt = claim(settings, job_id, worker_name)
    if attempt is None:
        log.info("job %s is not claimable (cancelled, finished or running elsewhere): skipped", job_id)
        return None
    sessions = session_factory(settings)
    heartbeat = Heartbeat(
        lambda: _renew(sessions, attempt, settings.lease_timeout_s),
        settings.heartbeat_interval_s,
        settings.lease_timeout_s,
        shutdown=shutdown.requested,
    )
    status: str | None
    error: dict[str, Any] | None = None
    with heartbeat:
        try:
            spec = parse_spec(attempt.spec)
            status = train(settings, spec, attempt, heartbeat)
        except Exception as exc:
            status, error = "failed", {"type": type(exc).__name__, "message": str(exc) or repr(exc)}
            log.exception("job %s failed", job_id)
            if not heartbeat.lease_lost:
                with sessions.begin() as session:
                    add_event(session, job_id, "traceback", f"{error['type']}: {error['message']}",
                              {"traceback": traceback.format_exc()[-TRACEBACK_LIMIT:]},
                              attempt=attempt.attempt)
    if heartbeat.lease_lost or status is None:
        log.error("job %s: lease lost; leaving the job to its new owner", job_id)
        return None
    if status == HANDED_BACK:
        queue = retry_while_unreachable(lambda: _hand_back(sessions, attempt),
                                        what=f"job {job_id}: handing back", for_s=settings.lease_timeout_s)
        if queue is not None:
            # after the commit, as the reaper does
            enqueue_job(settings, job_id, queue, PRIORITIES.get(attempt.spec.get("priority", "")))
            log.warning("job %s handed back to queue %s: this worker process was asked to stop (SIGTERM)", job_id, queue)
            return "queued"
        status = "cancelled"  # a cancel came first (or the lease is gone: finishing fails too)
    # The outcome survives a database outage at the very end (retried for a lease timeout).
    if not retry_while_unreachable(
        lambda: _finish(sessions, attempt, status, error),
        what=f"job {job_id}: recording {status}", for_s=settings.lease_timeout_s,
    ):
        log.error("job %s: lease lost before recording %s", job_id, status)
        return None
    if settings.max_running_jobs_per_owner:
        nudge_next_in_line(settings, job_id)
    return status


def nudge_next_in_line(settings: Any, job_id: str) -> None:
    """The owner's next queued job on this queue may start now that this one ended (a worker
    may have dropped its message while the running cap held it)."""
    try:
        with session_factory(settings)() as session:
            following = next_in_line(session, job_id)
        if following is not None:
            enqueue_job(settings, *following)
    except Exception:  # the reaper's lost-message rescue sends it later
        log.warning("job %s: could not nudge its owner's next job", job_id, exc_info=True)


def _finish(sessions: sessionmaker[Session], attempt: Attempt, status: str,
            error: dict[str, Any] | None) -> bool:
    with sessions.begin() as session:
        return finish_job(session, attempt.job_id, attempt.worker_id, status, error=error)


def _hand_back(sessions: sessionmaker[Session], attempt: Attempt) -> str | None:
    with sessions.begin() as session:
        return hand_back_job(session, attempt.job_id, attempt.worker_id)


def _renew(sessions: sessionmaker[Session], attempt: Attempt, lease_timeout_s: float) -> str | None:
    with sessions.begin() as session:
        return renew_lease(session, attempt.job_id, attempt.worker_id, lease_timeout_s)


def prepare_resume(sessions: sessionmaker[Session], attempt: Attempt, checkpoint_dir: Path) -> str | None:
    """Drop the metrics a predecessor logged after the checkpoint this attempt resumes from
    (all of them when it starts over) and the checkpoint files no row lists (a predecessor
    killed mid-write left them in ``checkpoint_dir``); returns the checkpoint file to load,
    if any."""
    with sessions.begin() as session:
        delete_metrics_after(session, attempt.job_id, attempt.resume_step)
        remove_orphans(checkpoint_dir, [c.step for c in list_checkpoints(session, attempt.job_id)])
        if attempt.resume_step is None:
            return None
        checkpoint = get_checkpoint(session, attempt.job_id, attempt.resume_step)
        if checkpoint is None:
            raise FileNotFoundError(
                f"job {attempt.job_id} should resume from step {attempt.resume_step} but that "
                "checkpoint has no record; POST /resume again to restart from the latest one"
            )
        return checkpoint.uri


def train(settings: Any, spec: JobSpec, attempt: Attempt, heartbeat: Heartbeat) -> str | None:
    """Train on this process (or on ``spec.gpus`` DDP processes); returns the outcome."""
    require_allowed_data_root(spec.dataset.data_root, settings)  # the API checked it too
    if spec.gpus > 1:
        from services.worker.distributed import train_distributed

        return train_distributed(settings, spec, attempt, heartbeat)
    from services.worker.training import train_local

    return train_local(settings, spec, attempt, heartbeat)
