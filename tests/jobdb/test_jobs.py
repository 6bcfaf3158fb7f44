"""API-side job functions: create (idempotent), owner scoping, keyset listing, cancel, resume."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import checkpoints, events, jobs, leases, tokens
from services.jobdb.errors import IdempotencyConflict, InvalidCursor, JobStateError
from services.jobdb.models import Job, Owner


def row(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    assert job is not None, job_id
    return job


def event_kinds(session_factory: sessionmaker[Session], job_id: str) -> list[str]:
    with session_factory() as session:
        return [e.kind for e in events.list_events(session, job_id)]


def test_create_job_stores_a_queued_job_with_its_event(
    session_factory: sessionmaker[Session], owner: Owner, spec: dict[str, Any]
) -> None:
    with session_factory.begin() as session:
        job, created = jobs.create_job(
            session,
            owner=owner,
            spec=spec,
            name="digits-mlp",
            queue="gpu-a100",
            effective_batch_size=64,
            total_optimizer_steps=28,
            max_restarts=2,
        )
    assert created
    with session_factory() as session:
        stored = jobs.get_job(session, job.id, owner)
        assert stored is not None
        assert (stored.status, stored.queue, stored.name, stored.attempts) == (
            "queued",
            "gpu-a100",
            "digits-mlp",
            0,
        )
        assert stored.spec == spec and stored.spec_hash == jobs.spec_hash(spec)
        assert stored.progress == {"epoch": 0, "optimizer_step": 0, "total_optimizer_steps": 28}
        assert stored.effective_batch_size == 64 and stored.max_restarts == 2
        assert stored.error is None and stored.latest_metrics == {}
        assert stored.created_at.tzinfo is not None and stored.started_at is None
    assert event_kinds(session_factory, job.id) == ["created"]


def test_a_new_job_answers_every_column_without_another_query(
    session_factory: sessionmaker[Session], owner: Owner, spec: dict[str, Any]
) -> None:
    """The submit answers from the row it inserted: reading any column (or the attempts) of
    the new job costs no SELECT, and the values are the stored ones."""
    with session_factory() as session:
        job, _ = jobs.create_job(session, owner=owner, spec=spec, queue="default",
                                 effective_batch_size=64, total_optimizer_steps=28, max_restarts=0)
        session.commit()
        statements: list[str] = []
        listen = sqlalchemy.event.listen
        engine = session.get_bind()
        def count(*args: Any) -> None:
            statements.append(str(args[2]))
        listen(engine, "before_cursor_execute", count)
        try:
            values = {c.key: getattr(job, c.key) for c in Job.__mapper__.column_attrs}
            assert job.attempt_list == [] and job.tags == []
        finally:
            sqlalchemy.event.remove(engine, "before_cursor_execute", count)
        assert statements == []
    with session_factory() as session:
        stored = row(session, job.id)
        assert {c.key: getattr(stored, c.key) for c in Job.__mapper__.column_attrs} == values


def test_spec_hash_ignores_key_order_but_not_values(spec: dict[str, Any]) -> None:
    reordered = dict(reversed(list(spec.items())))
    assert jobs.spec_hash(reordered) == jobs.spec_hash(spec)
    assert jobs.spec_hash(dict(spec, epochs=2)) != jobs.spec_hash(spec)


def test_idempotency_key_returns_the_same_job_or_conflicts(
    session_factory: sessionmaker[Session], owner: Owner, spec: dict[str, Any]
) -> None:
    with session_factory.begin() as session:
        first, created = jobs.create_job(session, owner=owner, spec=spec, idempotency_key="k-1")
    assert created
    with session_factory.begin() as session:
        again, created = jobs.create_job(
            session, owner=owner, spec=dict(reversed(list(spec.items()))), idempotency_key="k-1"
        )
    assert not created and again.id == first.id
    with session_factory.begin() as session, pytest.raises(IdempotencyConflict) as conflict:
        jobs.create_job(session, owner=owner, spec=dict(spec, epochs=3), idempotency_key="k-1")
    assert conflict.value.job_id == first.id and "different body" in str(conflict.value)
    # Keys are per owner: another owner may reuse it.
    with session_factory.begin() as session:
        bob, _ = tokens.create_owner_with_token(session, "bob")
        other, created = jobs.create_job(session, owner=bob, spec=spec, idempotency_key="k-1")
    assert created and other.id != first.id
    assert event_kinds(session_factory, first.id) == ["created"]


def test_concurrent_requests_with_one_key_create_one_job(
    session_factory: sessionmaker[Session], owner: Owner, spec: dict[str, Any]
) -> None:
    barrier = threading.Barrier(4)
    results: list[tuple[str, bool]] = []
    errors: list[BaseException] = []

    def request() -> None:
        try:
            barrier.wait()
            with session_factory.begin() as session:
                job, created = jobs.create_job(
                    session, owner=owner, spec=spec, idempotency_key="same"
                )
                results.append((job.id, created))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=request) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len({job_id for job_id, _ in results}) == 1
    assert sorted(created for _, created in results) == [False, False, False, True]


def test_get_job_is_owner_scoped_and_admins_see_all(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job], owner: Owner
) -> None:
    job = make_job()
    with session_factory.begin() as session:
        mallory, _ = tokens.create_owner_with_token(session, "mallory")
        admin, _ = tokens.create_owner_with_token(session, "root", admin=True)
    with session_factory() as session:
        assert jobs.get_job(session, job.id, owner) is not None
        assert jobs.get_job(session, job.id, mallory) is None
        assert jobs.get_job(session, job.id, admin) is not None
        assert jobs.get_job(session, "no-such-job", owner) is None


def test_list_jobs_pages_newest_first_without_gaps_or_repeats(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job], owner: Owner
) -> None:
    created = [make_job(seed=i).id for i in range(7)]
    with session_factory.begin() as session:
        bob, _ = tokens.create_owner_with_token(session, "bob")
        admin, _ = tokens.create_owner_with_token(session, "root", admin=True)
    bobs = make_job(owner=bob).id
    seen: list[str] = []
    cursor = None
    with session_factory() as session:
        while True:
            page, cursor = jobs.list_jobs(session, owner, limit=3, cursor=cursor)
            assert len(page) <= 3
            seen += [job.id for job in page]
            if cursor is None:
                break
        assert seen == list(reversed(created))
        everything, _ = jobs.list_jobs(session, admin, limit=100)
        assert [job.id for job in everything] == [bobs, *reversed(created)]


def test_list_jobs_filters_by_status_and_refuses_bad_input(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job], owner: Owner
) -> None:
    queued, cancelled = make_job(seed=1), make_job(seed=2)
    with session_factory.begin() as session:
        jobs.request_cancel(session, row(session, cancelled.id))
    with session_factory() as session:
        page, cursor = jobs.list_jobs(session, owner, status="cancelled")
        assert [job.id for job in page] == [cancelled.id] and cursor is None
        page, _ = jobs.list_jobs(session, owner, status="queued")
        assert [job.id for job in page] == [queued.id]
        with pytest.raises(ValueError, match="unknown status 'done'; use one of queued"):
            jobs.list_jobs(session, owner, status="done")
        with pytest.raises(ValueError, match="limit"):
            jobs.list_jobs(session, owner, limit=0)
        with pytest.raises(InvalidCursor, match="next_cursor"):
            jobs.list_jobs(session, owner, cursor="not a cursor")


def test_cancel_a_queued_job_finishes_it_at_once_and_it_never_starts(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    with session_factory.begin() as session:
        cancelled = jobs.request_cancel(session, row(session, job.id))
        assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    with session_factory.begin() as session:
        assert leases.claim_job(session, job.id, "w1", "host", None, 60) is None
    with session_factory.begin() as session, pytest.raises(JobStateError, match="it is cancelled"):
        jobs.request_cancel(session, row(session, job.id))
    assert event_kinds(session_factory, job.id) == ["created", "cancelled"]


def test_cancel_a_running_job_asks_its_worker(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    with session_factory.begin() as session:
        leases.claim_job(session, job.id, "w1", "host", "0", 60)
    with session_factory.begin() as session:
        assert jobs.request_cancel(session, row(session, job.id)).status == "cancelling"
    with session_factory.begin() as session:  # repeating it is harmless
        assert jobs.request_cancel(session, row(session, job.id)).status == "cancelling"
        assert leases.renew_lease(session, job.id, "w1", 60) == "cancelling"
    with session_factory.begin() as session:
        assert leases.finish_job(session, job.id, "w1", "cancelled")
    with session_factory.begin() as session, pytest.raises(JobStateError) as refused:
        jobs.request_cancel(session, row(session, job.id))
    assert refused.value.status == "cancelled" and "queued or running" in str(refused.value)
    assert event_kinds(session_factory, job.id) == [
        "created",
        "started",
        "cancel_requested",
        "cancelled",
    ]


def test_cancel_a_succeeded_job_says_which_state_it_is_in(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    with session_factory.begin() as session:
        leases.claim_job(session, job.id, "w1", "host", "0", 60)
        leases.finish_job(session, job.id, "w1", "succeeded")
    with session_factory.begin() as session, pytest.raises(JobStateError, match="it is succeeded"):
        jobs.request_cancel(session, row(session, job.id))


def test_resume_requeues_from_the_latest_checkpoint(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    with session_factory.begin() as session:
        leases.claim_job(session, job.id, "w1", "host", "0", 60)
        for step in (10, 20):
            checkpoints.add_checkpoint(
                session, job.id, step, f"/a/{step}.pt", 1, "0" * 64, attempt=1
            )
        leases.finish_job(
            session, job.id, "w1", "failed", {"type": "RuntimeError", "message": "boom"}
        )
    with session_factory.begin() as session:
        resumed = jobs.request_resume(session, row(session, job.id))
        assert (resumed.status, resumed.resume_step, resumed.error, resumed.finished_at) == (
            "queued",
            20,
            None,
            None,
        )
    with session_factory.begin() as session:
        again = leases.claim_job(session, job.id, "w2", "host", "0", 60)
        assert again is not None and again.attempts == 2 and again.resume_step == 20
    with session_factory.begin() as session, pytest.raises(JobStateError, match="it is running"):
        jobs.request_resume(session, row(session, job.id))
    assert event_kinds(session_factory, job.id) == [
        "created",
        "started",
        "failed",
        "resumed",
        "started",
    ]


def test_resume_without_checkpoint_starts_over_and_queued_cannot_resume(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    queued, cancelled = make_job(seed=1), make_job(seed=2)
    with session_factory.begin() as session:
        jobs.request_cancel(session, row(session, cancelled.id))
        resumed = jobs.request_resume(session, row(session, cancelled.id))
        assert resumed.status == "queued" and resumed.resume_step is None
    with (
        session_factory.begin() as session,
        pytest.raises(JobStateError, match="failed or cancelled"),
    ):
        jobs.request_resume(session, row(session, queued.id))


def test_a_new_jobs_short_id_is_unique_among_its_owners_jobs(
    session_factory: sessionmaker[Session], owner: Owner, make_job: Callable[..., Job],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The short id (the id's last 6 characters) names one of the owner's jobs: an id whose
    tail one of them has is drawn again; another owner's jobs do not count."""
    taken = make_job().id
    with session_factory.begin() as session:
        bob, _ = tokens.create_owner_with_token(session, "bob")
    ids = iter(["01kbzzzzzz0000000000" + taken[-6:], "01kbzzzzzz0000000001abcdef",
                "01kbzzzzzz0000000002" + taken[-6:]])
    monkeypatch.setattr(jobs, "new_id", lambda: next(ids))
    assert make_job().id == "01kbzzzzzz0000000001abcdef"
    assert make_job(owner=bob).id.endswith(taken[-6:])  # bob's first job: nothing to clash with
