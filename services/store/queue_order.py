"""Queue order: job priorities, a queued job's place in line, and the per-owner cap on running
jobs per queue.

Priorities are stored as numbers (``PRIORITIES``), higher first. The broker delivers higher
priorities first where it can (Redis: ``services.worker.priority``); a queued job's place in
line counts the queued jobs of its queue that go before it: higher priority, or the same
priority and submitted earlier.
"""

from __future__ import annotations

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from services.store.models import Job

PRIORITIES = {"low": 0, "normal": 1, "high": 2}
PRIORITY_NAMES = {number: name for name, number in PRIORITIES.items()}


def queue_position(session: Session, job: Job) -> int:
    """1 for the next job its queue's workers take, 2 for the one after, ..."""
    ahead = session.scalar(
        select(func.count()).select_from(Job).where(
            Job.queue == job.queue,
            Job.status == "queued",
            or_(Job.priority > job.priority, and_(Job.priority == job.priority, Job.id < job.id)),
        )
    )
    return int(ahead or 0) + 1
