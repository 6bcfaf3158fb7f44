"""Job attempts: one row per start of a job (``job_attempts``), opened by the claim and closed
with the outcome by whichever transition ends it (``leases``: finish, hand-back, reaping, a
takeover). Steps done = ``end_step`` - ``resume_step``. Functions here flush, never commit.

Outcomes: ``succeeded``, ``failed``, ``cancelled``, ``handed_back`` (the worker shut down and
gave the job back), ``store_fault`` (the artifact store failed it: the job went back to the
queue with a restart counted), ``node_lost`` (a node of its multi-node gang was lost: queued
again with a restart counted), ``hung`` (a rank made no progress past its deadline, its
supervisor ended it: queued again with a restart counted), ``lost`` (its lease expired: the worker died or was cut off).
``record_process_death`` writes why an attempt's process died (``cause``), when its worker saw
it die; the reaper then closes it as ``lost`` and the poison rule names the cause.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, insert, select, update
from sqlalchemy.orm import Session

from services.jobdb.events import add_event
from services.jobdb.models import Job, JobAttempt
from services.jobdb.status import ACTIVE, ordered
from services.jobdb.types import utcnow

OUTCOMES = ("succeeded", "failed", "cancelled", "handed_back", "store_fault", "node_lost", "hung", "lost")
_INSERT = insert(cast(Table, JobAttempt.__table__))


def open_attempt(
    session: Session,
    job: Job,
    worker: str | None,
    now: datetime | None = None,
) -> None:
    """Record the start of ``job.attempts`` (the claim just counted it). Does not commit."""
    session.connection().execute(_INSERT, dict(
        job_id=job.id, attempt=job.attempts, worker=worker, host=job.worker_host,
        gpu=job.worker_gpu, resume_step=job.resume_step, started_at=now or utcnow(),
    ))


def close_attempt(
    session: Session, job_id: str, attempt: int, outcome: str, now: datetime | None = None,
    last_heartbeat: datetime | None = None,
) -> None:
    """End an open attempt with ``outcome``, at the step the job's progress shows, and add its
    run time to the job's ``run_seconds`` (a ``lost`` attempt ran until its last heartbeat:
    ``last_heartbeat``, else the job's ``heartbeat_at``). An attempt already closed (or never
    recorded: a job from before the table) is left alone."""
    if outcome not in OUTCOMES:
        raise ValueError(f"attempt outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
    now = now or utcnow()
    job = session.execute(
        select(Job.progress, Job.heartbeat_at).where(Job.id == job_id)
    ).one_or_none()
    progress: dict[str, Any] = (job.progress if job is not None else None) or {}
    started = session.scalar(
        update(JobAttempt)
        .where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt,
               JobAttempt.ended_at.is_(None))
        .values(outcome=outcome, ended_at=now, end_step=progress.get("optimizer_step"))
        .returning(JobAttempt.started_at)
        .execution_options(synchronize_session=False)
    )
    if started is None:
        return
    end = now
    beat = last_heartbeat or (job.heartbeat_at if job is not None else None)
    if outcome == "lost" and beat is not None:
        end = min(now, max(beat, started))
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(run_seconds=Job.run_seconds + (end - started).total_seconds())
        .execution_options(synchronize_session=False)
    )


def record_phases(session: Session, job_id: str, attempt: int, phases: dict[str, float]) -> None:
    """Where the attempt's time went (``services.worker.phases``), on its row. Does not commit."""
    if not phases:
        return
    session.execute(
        update(JobAttempt)
        .where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
        .values(phases=phases)
        .execution_options(synchronize_session=False)
    )


def record_process_death(
    session: Session, job_id: str, worker_name: str, cause: str, now: datetime | None = None
) -> int | None:
    """The process of ``worker_name`` (a Celery node name) running the job died: ``cause`` goes
    on that worker's latest attempt of the job and in a ``process_died`` event; if the worker
    still holds the lease, it expires now, so the reaper re-queues the job (or fails it as
    poison, naming the cause) without waiting for the lease timeout. Returns the attempt, or
    None when that worker never ran the job. Does not commit.
    """
    now = now or utcnow()
    attempt = session.scalar(
        select(JobAttempt.attempt)
        .where(JobAttempt.job_id == job_id, JobAttempt.worker == worker_name)
        .order_by(JobAttempt.attempt.desc())
        .limit(1)
    )
    if attempt is None:
        return None
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(ordered(ACTIVE)), Job.attempts == attempt,
               Job.lease_owner.startswith(f"{worker_name}/", autoescape=True))
        .values(lease_expires_at=now, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    session.execute(
        update(JobAttempt)
        .where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
        .values(cause=cause)
        .execution_options(synchronize_session=False)
    )
    progress: dict[str, Any] = session.scalar(select(Job.progress).where(Job.id == job_id)) or {}
    step = progress.get("optimizer_step", 0)
    add_event(session, job_id, "process_died", f"{cause} at optimizer step {step}",
              {"cause": cause, "worker": worker_name, "step": step}, attempt=attempt)
    return int(attempt)
