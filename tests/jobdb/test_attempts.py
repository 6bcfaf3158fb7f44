"""Attempt rows (``services/jobdb/attempts.py``) through the transitions that end them: a
hand-back after a store fault closes its attempt as ``store_fault`` (it stayed open, answered
as ``running``; a lost node of a gang as ``node_lost``, a restart counted until max_restarts
fails the job), and a claim rewinds the job's progress to the attempt's ``resume_step``, so an
attempt that ends before its first step did none (it counted the previous attempt's steps)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import checkpoints, jobs, leases
from services.jobdb.models import Job, JobAttempt
from services.jobdb.types import utcnow

LEASE_S = 60


def attempts(session_factory: sessionmaker[Session], job_id: str) -> list[tuple[str | None, int | None, int | None]]:
    """``(outcome, resume_step, end_step)`` of each attempt, in order."""
    with session_factory() as session:
        rows = session.scalars(select(JobAttempt).where(JobAttempt.job_id == job_id)
                               .order_by(JobAttempt.attempt))
        return [(r.outcome, r.resume_step, r.end_step) for r in rows]


def train_to(session_factory: sessionmaker[Session], job_id: str, worker: str, step: int,
             checkpoint: int | None = None) -> None:
    """The worker's progress reaches ``step``, with a checkpoint row at ``checkpoint``."""
    with session_factory.begin() as session:
        leases.update_progress(session, job_id, {"optimizer_step": step, "epoch": 1}, worker_id=worker)
        if checkpoint is not None:
            checkpoints.add_checkpoint(session, job_id, checkpoint, f"{job_id}/{checkpoint}.pt", 1,
                                       "0" * 64, attempt=1, epoch=0)


def claim(session_factory: sessionmaker[Session], job_id: str, worker: str, **kwargs: object) -> Job:
    with session_factory.begin() as session:
        job = leases.claim_job(session, job_id, worker, "host", "0", LEASE_S, **kwargs)  # type: ignore[arg-type]
        assert job is not None
        return job


def test_a_store_fault_hand_back_closes_the_attempt_with_its_own_steps(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job(max_restarts=3)
    claim(session_factory, job.id, "w1")
    train_to(session_factory, job.id, "w1", 9, checkpoint=4)  # trained past its last stored checkpoint
    with session_factory.begin() as session:
        assert leases.requeue_after_fault(session, job.id, "w1", "store down") == ("queued", "default")
    assert attempts(session_factory, job.id) == [("store_fault", None, 9)]

    # The next attempt resumes from step 4 and faults again before its first step: 0 steps.
    again = claim(session_factory, job.id, "w2")
    assert again.resume_step == 4 and again.progress["optimizer_step"] == 4
    assert again.progress["epoch"] == 0  # the checkpoint's epoch, not the later step's
    with session_factory.begin() as session:
        assert leases.requeue_after_fault(session, job.id, "w2", "store down")
    assert attempts(session_factory, job.id) == [("store_fault", None, 9), ("store_fault", 4, 4)]


def test_no_restarts_left_closes_the_faulted_attempt_as_failed(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job(max_restarts=0)
    claim(session_factory, job.id, "w1")
    with session_factory.begin() as session:
        assert leases.requeue_after_fault(session, job.id, "w1", "store down")[0] == "failed"  # type: ignore[index]
    assert attempts(session_factory, job.id) == [("failed", None, 0)]


def lose_a_node(session_factory: sessionmaker[Session], job_id: str, worker: str) -> tuple[str, str] | None:
    """Node 0 (``worker``) saw a peer of its gang lost: the job goes back, a restart counted."""
    with session_factory.begin() as session:
        return leases.requeue_after_fault(session, job_id, worker, "node 0 of 2: peer gone",
                                          fault=leases.NODE_LOST)


def test_a_lost_node_is_a_restart_and_a_job_that_keeps_losing_nodes_fails_saying_why(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job_id = make_job(max_restarts=1).id
    claim(session_factory, job_id, "w1")
    train_to(session_factory, job_id, "w1", 6, checkpoint=5)
    assert lose_a_node(session_factory, job_id, "w1") == ("queued", "default")
    again = claim(session_factory, job_id, "w2")
    assert again.restarts == 1 and again.resume_step == 5
    moved = lose_a_node(session_factory, job_id, "w2")
    assert moved is not None and moved[0] == "failed"
    assert attempts(session_factory, job_id) == [("node_lost", None, 6), ("failed", 5, 5)]
    with session_factory() as session:
        failed = session.get(Job, job_id)
        assert failed is not None and failed.status == "failed" and failed.restarts == 1
        assert failed.error["type"] == "NodeLost" and failed.error["reason"] == "max_restarts"
        assert "max_restarts reached" in failed.error["message"]
        assert "a node of its gang was lost" in failed.error["message"]


def test_a_takeover_and_a_resume_from_scratch_start_the_progress_where_they_start(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job(max_restarts=3)
    claim(session_factory, job.id, "w1")
    train_to(session_factory, job.id, "w1", 7, checkpoint=5)
    later = utcnow() + timedelta(seconds=LEASE_S + 1)
    taken = claim(session_factory, job.id, "w2", now=later)  # w1's lease expired
    assert (taken.resume_step, taken.progress["optimizer_step"]) == (5, 5)
    train_to(session_factory, job.id, "w2", 8)
    with session_factory.begin() as session:
        assert leases.finish_job(session, job.id, "w2", "cancelled")
        stored = jobs.load_job(session, job.id)
        assert stored is not None
        jobs.request_resume(session, stored, from_scratch=True)
    claim(session_factory, job.id, "w3")
    assert attempts(session_factory, job.id) == [("lost", None, 7), ("cancelled", 5, 8), (None, None, None)]
    with session_factory() as session:
        assert session.get(Job, job.id).progress["optimizer_step"] == 0  # type: ignore[union-attr]
