"""The per-owner cap on unfinished jobs (queued, running, cancelling).

    recount = near_cap(session, owner.id, cap)        # before writing the job
    ... insert or re-queue the job ...
    if recount:
        confirm_under_cap(session, owner.id, cap)     # ActiveJobCapReached: roll back

Far from the cap (more than NEAR_CAP places left) a submit only counts, so one owner's
submits run side by side. Within NEAR_CAP of it, the count is taken again after the write:
on PostgreSQL under a per-owner advisory lock held until commit, so each such submit sees
every one that passed before it; on SQLite the write already holds the single write lock.
That makes the cap exact unless NEAR_CAP of the owner's submits get through while one of
its submits is between its first count and its commit (a few milliseconds): more than
NEAR_CAP concurrent submits by one owner. The lock is taken after the inserts, so it is
held only for the count and the commit.
"""

from __future__ import annotations

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.orm import Session

from services.jobdb.errors import ActiveJobCapReached
from services.jobdb.models import Job
from services.jobdb.status import UNFINISHED, ordered

# Places left below which a submit counts again under the lock (see the module docstring).
NEAR_CAP = 64
# Namespace of the two-key advisory locks (a key space apart from the one-key locks that
# metric_blocks takes per job): "accq" in ASCII.
_OWNER_JOBS_LOCK = 0x61636371
# Built once and run on the session's connection: submit is a hot path, and this skips the
# ORM's statement handling and hits the compiled-statement cache.
_LOCK = text("SELECT pg_advisory_xact_lock(:space, :owner)")
_UNFINISHED = select(Job.id).where(
    Job.owner_id == bindparam("owner"), Job.status.in_(ordered(UNFINISHED))
)
_COUNT = select(func.count()).select_from(_UNFINISHED.subquery())
# A bounded scan: an owner far past the cap costs no more than one at it.
_COUNT_UP_TO = select(func.count()).select_from(_UNFINISHED.limit(bindparam("up_to")).subquery())


def near_cap(session: Session, owner_id: int, cap: int) -> bool:
    """Whether the owner has fewer than NEAR_CAP places left, so that a job written now
    must be confirmed with `confirm_under_cap` (a cheap bounded count otherwise)."""
    return count_active_jobs(session, owner_id, up_to=cap + 1) > cap - NEAR_CAP


def confirm_under_cap(session: Session, owner_id: int, cap: int) -> None:
    """After writing a job: raise ActiveJobCapReached if the owner now has more than ``cap``
    unfinished jobs, counted under the owner's lock. The caller must roll back on it."""
    if session.get_bind().dialect.name == "postgresql":
        session.connection().execute(_LOCK, {"space": _OWNER_JOBS_LOCK, "owner": owner_id})
    if count_active_jobs(session, owner_id, up_to=cap + 1) > cap:
        # The exact figure for the message (rare path: the bounded count stopped at cap + 1).
        before = count_active_jobs(session, owner_id) - 1
        raise ActiveJobCapReached(cap, before)


def count_active_jobs(session: Session, owner_id: int, up_to: int | None = None) -> int:
    """The owner's unfinished jobs; with ``up_to``, counting stops there."""
    if up_to is None:
        return int(session.connection().execute(_COUNT, {"owner": owner_id}).scalar_one())
    params = {"owner": owner_id, "up_to": up_to}
    return int(session.connection().execute(_COUNT_UP_TO, params).scalar_one())
