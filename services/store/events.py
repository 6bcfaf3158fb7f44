"""Job events: the lifecycle log (kinds in docs/architecture.md).

State transitions in ``jobs`` and ``leases`` write their own events in the same transaction
(``created``, ``started``, ``cancel_requested``, ``cancelled``, ``succeeded``, ``failed``,
``resumed``, ``lease_expired``, ``requeued``); the worker adds the rest (``traceback``,
``checkpoint``, ``oom_backoff``, ...) with ``add_event``. Functions here flush, never commit.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.store.models import JobEvent


def add_event(
    session: Session,
    job_id: str,
    kind: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    attempt: int = 0,
) -> JobEvent:
    """Append one event; returns it with ``id`` and ``created_at`` set. Does not commit."""
    event = JobEvent(job_id=job_id, kind=kind, message=message, data=data or {}, attempt=attempt)
    session.add(event)
    session.flush()
    return event


def list_events(
    session: Session, job_id: str, after_id: int | None = None, limit: int = 100
) -> list[JobEvent]:
    """Events of a job in order, oldest first, with ``id > after_id`` (for polling/SSE)."""
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    query = select(JobEvent).where(JobEvent.job_id == job_id)
    if after_id is not None:
        query = query.where(JobEvent.id > after_id)
    return list(session.scalars(query.order_by(JobEvent.id).limit(limit)))


def latest_event(session: Session, job_id: str, kind: str) -> JobEvent | None:
    """The job's most recent event of this kind, or None."""
    query = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == kind)
    return session.scalars(query.order_by(JobEvent.id.desc()).limit(1)).first()
