"""The per-owner cap on unfinished jobs in the store: counted on create and resume, finished
jobs free a place, an idempotent replay at the cap still returns its job."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from job_specs import MINIMAL_SPEC
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import jobs, quotas
from services.jobdb.errors import ActiveJobCapReached
from services.jobdb.models import Job, Owner


def submit(
    session_factory: sessionmaker[Session], owner: Owner, cap: int, key: str | None = None
) -> Job:
    with session_factory.begin() as session:
        job, _ = jobs.create_job(
            session, owner=owner, spec=MINIMAL_SPEC, idempotency_key=key, max_active_jobs=cap
        )
    return job


def loaded(session: Session, job_id: str) -> Job:
    job = jobs.load_job(session, job_id)
    assert job is not None
    return job


def active(session_factory: sessionmaker[Session], owner: Owner) -> int:
    with session_factory() as session:
        return quotas.count_active_jobs(session, owner.id)


def test_past_the_cap_nothing_is_written_and_a_finished_job_frees_a_place(
    session_factory: sessionmaker[Session], owner: Owner
) -> None:
    first, _ = submit(session_factory, owner, 2, "a"), submit(session_factory, owner, 2)

    with pytest.raises(ActiveJobCapReached) as refused:
        submit(session_factory, owner, 2)

    assert (refused.value.cap, refused.value.active) == (2, 2)
    assert "limit per owner is 2" in str(refused.value)
    assert active(session_factory, owner) == 2
    # The same key again is a replay of job "a", not a new job: allowed at the cap.
    assert submit(session_factory, owner, 2, "a").id == first.id
    with session_factory.begin() as session:
        jobs.request_cancel(session, loaded(session, first.id))
    assert submit(session_factory, owner, 2).status == "queued"


def test_resume_counts_too(
    session_factory: sessionmaker[Session], owner: Owner, make_job: Callable[..., Job]
) -> None:
    cancelled = make_job()
    with session_factory.begin() as session:
        jobs.request_cancel(session, loaded(session, cancelled.id))
    submit(session_factory, owner, 1)

    with pytest.raises(ActiveJobCapReached), session_factory.begin() as session:
        jobs.request_resume(session, loaded(session, cancelled.id), 1)
    assert active(session_factory, owner) == 1  # rolled back: still cancelled

    with session_factory.begin() as session:
        jobs.request_resume(session, loaded(session, cancelled.id), 2)
    assert active(session_factory, owner) == 2


def test_far_from_the_cap_a_submit_does_not_count_again(
    session_factory: sessionmaker[Session], owner: Owner
) -> None:
    with session_factory() as session:
        # No jobs: NEAR_CAP places left is far enough, one fewer is near.
        assert not quotas.near_cap(session, owner.id, quotas.NEAR_CAP)
        assert quotas.near_cap(session, owner.id, quotas.NEAR_CAP - 1)
