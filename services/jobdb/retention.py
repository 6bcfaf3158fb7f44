"""Retention and quota of stored checkpoints: what ``ACCUM_RETENTION_DAYS`` deletes, and how
many bytes an owner's checkpoints take (``ACCUM_MAX_ARTIFACT_BYTES_PER_OWNER``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from services.jobdb.models import Checkpoint, Job
from services.jobdb.status import FINISHED, ordered


def checkpoints_past_retention(session: Session, finished_before: datetime,
                               limit: int = 1000) -> list[Checkpoint]:
    """Checkpoints of jobs that finished before ``finished_before``, except each job's final
    (latest step) and best (by val_loss) one: what retention deletes, oldest jobs first."""
    final = (select(func.max(Checkpoint.step)).where(Checkpoint.job_id == Job.id)
             .correlate(Job).scalar_subquery())
    query = (
        select(Checkpoint)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Job.status.in_(ordered(FINISHED)), Job.finished_at < finished_before,
               Checkpoint.is_best.is_(False), Checkpoint.step != final)
        .order_by(Job.finished_at, Checkpoint.job_id, Checkpoint.step)
        .limit(limit)
    )
    return list(session.scalars(query))


def owner_artifact_bytes(session: Session, job_id: str) -> int:
    """Bytes of every retained checkpoint of the owner of ``job_id`` (all their jobs)."""
    owner = select(Job.owner_id).where(Job.id == job_id).scalar_subquery()
    total = session.scalar(
        select(func.sum(Checkpoint.size_bytes))
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Job.owner_id == owner)
    )
    return int(total or 0)
