"""A worker that shuts down hands its job back: queued again, resuming from its latest
checkpoint, no restart counted; only the lease holder can, and not past a cancel request."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import checkpoints, events, jobs, leases
from services.jobdb.models import Job

LEASE_S = 60


def claimed(session_factory: sessionmaker[Session], make_job: Callable[..., Job]) -> Job:
    job = make_job(queue="gpu")
    with session_factory.begin() as session:
        assert leases.claim_job(session, job.id, "w1", "host", "0", LEASE_S)
        checkpoints.add_checkpoint(session, job.id, 37, "/a/37.pt", 1, "0" * 64, attempt=1)
    return job


def test_hand_back_requeues_from_the_latest_checkpoint_without_a_restart(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = claimed(session_factory, make_job)
    with session_factory.begin() as session:
        assert leases.hand_back_job(session, job.id, "w2") is None  # not the holder
        assert leases.hand_back_job(session, job.id, "w1") == "gpu"
    with session_factory.begin() as session:
        again = leases.claim_job(session, job.id, "w2", "host2", "0", LEASE_S)
        assert again is not None
        assert (again.attempts, again.restarts, again.resume_step) == (2, 0, 37)
        requeued = [e for e in events.list_events(session, job.id) if e.kind == "requeued"]
    assert len(requeued) == 1 and requeued[0].data["reason"] == "worker_shutdown"


def test_no_hand_back_once_a_cancel_was_requested(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = claimed(session_factory, make_job)
    with session_factory.begin() as session:
        jobs.request_cancel(session, jobs.load_job(session, job.id))  # type: ignore[arg-type]
        assert leases.hand_back_job(session, job.id, "w1") is None
        assert leases.finish_job(session, job.id, "w1", "cancelled")
