"""The running cap per owner and queue (ACCUM_MAX_RUNNING_JOBS_PER_OWNER): a queued job is
held while its owner runs the cap on its queue, never a takeover; the owner's next job in
line is the one a finished job's worker nudges."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import leases, tokens
from services.jobdb.queue_order import held_by_running_cap, next_in_line
from services.jobdb.types import utcnow


def held(session_factory: sessionmaker[Session], job_id: str, cap: int) -> bool:
    with session_factory.begin() as session:
        return held_by_running_cap(session, job_id, cap)


def run(session_factory: sessionmaker[Session], job_id: str, worker: str = "w") -> None:
    with session_factory.begin() as session:
        assert leases.claim_job(session, job_id, worker, "h", None, 60)


def test_the_cap_holds_an_owners_jobs_on_one_queue_only(
    session_factory: sessionmaker[Session], make_job: Any
) -> None:
    first, second, elsewhere = make_job(seed=1), make_job(seed=2), make_job(seed=3, queue="a100")
    with session_factory.begin() as session:
        bob, _ = tokens.create_owner_with_token(session, "bob")
    bobs = make_job(seed=4, owner=bob)
    assert not held(session_factory, first.id, 1)
    run(session_factory, first.id)
    assert held(session_factory, second.id, 1)  # alice runs 1 of 1 on default
    assert not held(session_factory, second.id, 2) and not held(session_factory, second.id, 0)
    assert not held(session_factory, elsewhere.id, 1)  # another queue
    assert not held(session_factory, bobs.id, 1)  # another owner
    # A takeover of the running job (its worker died) is not a new running job.
    with session_factory.begin() as session:
        late = utcnow() + timedelta(seconds=61)
        assert not held_by_running_cap(session, first.id, 1)
        assert leases.claim_job(session, first.id, "w2", "h", None, 60, now=late)


def test_next_in_line_is_the_owners_highest_priority_oldest_queued_job(
    session_factory: sessionmaker[Session], make_job: Any
) -> None:
    running = make_job(seed=1)
    make_job(seed=2, priority=0)
    normal = make_job(seed=3)
    make_job(seed=4, queue="a100", priority=2)
    run(session_factory, running.id)
    with session_factory() as session:
        assert next_in_line(session, running.id) == (normal.id, "default", 1)
