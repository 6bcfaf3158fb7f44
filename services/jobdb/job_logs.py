"""A job's own output: the lines its training process printed, per attempt.

The worker appends them in batches (``services/worker/output_capture.py``); the API pages
them by id (``GET /v1/jobs/{id}/logs?attempt=&after=&limit=``). Functions here flush, never
commit.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from services.jobdb.models import JobLogLine
from services.jobdb.types import utcnow

STREAMS = ("stdout", "stderr", "accum")  # "accum": the capture's own notes (lines dropped)


def add_lines(session: Session, job_id: str, attempt: int, lines: Iterable[tuple[str, str]]) -> int:
    """Append ``(stream, line)`` pairs of one attempt in order; returns how many. No commit."""
    now = utcnow()
    rows = [{"job_id": job_id, "attempt": attempt, "stream": stream, "line": line, "created_at": now}
            for stream, line in lines]
    if rows:
        session.execute(insert(JobLogLine), rows)
    return len(rows)


def list_lines(
    session: Session,
    job_id: str,
    attempt: int | None = None,
    after_id: int | None = None,
    limit: int = 1000,
) -> list[JobLogLine]:
    """The job's lines oldest first (one attempt's, or every attempt's), with ``id > after_id``."""
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    query = select(JobLogLine).where(JobLogLine.job_id == job_id)
    if attempt is not None:
        query = query.where(JobLogLine.attempt == attempt)
    if after_id is not None:
        query = query.where(JobLogLine.id > after_id)
    return list(session.scalars(query.order_by(JobLogLine.id).limit(limit)))
