"""Queue order: job priorities, a queued job's place in line, and the per-owner cap on running
jobs per queue.

Priorities are stored as numbers (``PRIORITIES``), higher first. The broker delivers higher
priorities first where it can (Redis: ``services.dispatch.priority``); a queued job's place in
line counts the queued jobs of its queue that go before it: higher priority, or the same
priority and submitted earlier.

The running cap is checked when a worker claims a job (``held_by_running_cap``): a job whose
owner already runs ``ACCUM_MAX_RUNNING_JOBS_PER_OWNER`` jobs on its queue stays queued and
its message is dropped; when one of them ends, the worker nudges the owner's next job in
line (``next_in_line``), and the reaper's lost-message rescue re-sends any other.
"""

from __future__ import annotations

import zlib

from sqlalchemy import and_, func, or_, select, text
from sqlalchemy.orm import Session

from services.jobdb.models import Job
from services.jobdb.status import ACTIVE, JobStatus, ordered
from services.spec.priority import PRIORITIES as PRIORITY_NAMES
from services.spec.priority import priority_number

# name -> the number stored on the job (services.spec.priority names them, in rising order)
PRIORITIES = {name: priority_number(name) for name in PRIORITY_NAMES}


def queue_position(session: Session, job: Job) -> int:
    """1 for the next job its queue's workers take, 2 for the one after, ..."""
    ahead = session.scalar(
        select(func.count()).select_from(Job).where(
            Job.queue == job.queue,
            Job.status == JobStatus.QUEUED,
            or_(Job.priority > job.priority, and_(Job.priority == job.priority, Job.id < job.id)),
        )
    )
    return int(ahead or 0) + 1


# Namespace of the two-key advisory locks that serialise one owner's claims on one queue
# ("accr" in ASCII; quotas.py uses "accq").
_OWNER_QUEUE_LOCK = 0x61636372
_LOCK = text("SELECT pg_advisory_xact_lock(:space, :key)")


def held_by_running_cap(session: Session, job_id: str, cap: int) -> bool:
    """Whether claiming this queued job would give its owner more than ``cap`` running jobs on
    its queue (``ACCUM_MAX_RUNNING_JOBS_PER_OWNER``; 0 = no cap). Call it in the claim's
    transaction: on PostgreSQL it takes a per-(owner, queue) lock held until the commit, so
    two workers claiming the same owner's jobs at once count one after the other; on SQLite
    the claim's write already serialises them. A job that is not queued (a takeover of a
    dead worker's job, which counts as running already) is never held."""
    if cap <= 0:
        return False
    row = session.execute(
        select(Job.owner_id, Job.queue).where(Job.id == job_id, Job.status == JobStatus.QUEUED)
    ).one_or_none()
    if row is None:
        return False
    if session.get_bind().dialect.name == "postgresql":
        key = zlib.crc32(f"{row.owner_id}/{row.queue}".encode()) - 2**31  # a signed int4
        session.execute(_LOCK, {"space": _OWNER_QUEUE_LOCK, "key": key})
    running = session.scalar(
        select(func.count()).select_from(Job).where(
            Job.owner_id == row.owner_id, Job.queue == row.queue,
            Job.status.in_(ordered(ACTIVE)), Job.id != job_id,
        )
    )
    return int(running or 0) >= cap


def next_in_line(session: Session, job_id: str) -> tuple[str, str, int] | None:
    """``(id, queue, priority)`` of the queued job of this job's owner and queue that goes
    first: when one of an owner's jobs ends, a job held by the running cap may start now."""
    owner_id, queue = session.execute(
        select(Job.owner_id, Job.queue).where(Job.id == job_id)
    ).one()
    row = session.execute(
        select(Job.id, Job.queue, Job.priority)
        .where(Job.owner_id == owner_id, Job.queue == queue, Job.status == JobStatus.QUEUED)
        .order_by(Job.priority.desc(), Job.id)
        .limit(1)
    ).one_or_none()
    return (row.id, row.queue, row.priority) if row is not None else None


def held_jobs(session: Session, job_ids: list[str], cap: int) -> set[str]:
    """Of these queued jobs, those the running cap holds (their owner runs ``cap`` jobs or more
    on their queue; 0 = no cap): a message would only be dropped by the claim."""
    if cap <= 0 or not job_ids:
        return set()
    running = (
        select(Job.owner_id, Job.queue, func.count().label("jobs"))
        .where(Job.status.in_(ordered(ACTIVE)))
        .group_by(Job.owner_id, Job.queue)
        .subquery()
    )
    held = session.scalars(
        select(Job.id)
        .join(running, and_(running.c.owner_id == Job.owner_id, running.c.queue == Job.queue))
        .where(Job.id.in_(job_ids), running.c.jobs >= cap)
    )
    return set(held)
