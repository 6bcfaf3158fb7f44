"""Checkpoint rows: add (upsert by step), best by val_loss, latest, and what to prune."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import checkpoints
from services.jobdb.models import Job


def add(
    session_factory: sessionmaker[Session], job_id: str, step: int, val_loss: float | None = None
) -> None:
    with session_factory.begin() as session:
        checkpoints.add_checkpoint(
            session,
            job_id,
            step,
            f"{job_id}/{step}.pt",
            1000 + step,
            f"{step:064d}",
            epoch=step // 10,
            metrics={} if val_loss is None else {"val_loss": val_loss},
            attempt=1,
        )


def test_add_list_get_latest(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job, other = make_job(seed=1), make_job(seed=2)
    for step in (20, 10, 30):
        add(session_factory, job.id, step)
    add(session_factory, other.id, 99)
    with session_factory() as session:
        assert [c.step for c in checkpoints.list_checkpoints(session, job.id)] == [10, 20, 30]
        found = checkpoints.get_checkpoint(session, job.id, 20)
        assert found is not None
        assert (found.key, found.size_bytes, found.sha256, found.epoch) == (
            f"{job.id}/20.pt",
            1020,
            f"{20:064d}",
            2,
        )
        assert found.created_at.tzinfo is not None
        assert checkpoints.get_checkpoint(session, job.id, 25) is None
        assert checkpoints.list_checkpoints(session, "no-such-job") == []


def test_rewriting_a_step_replaces_its_row(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    add(session_factory, job.id, 10, val_loss=2.0)
    with session_factory.begin() as session:
        checkpoints.add_checkpoint(session, job.id, 10, f"{job.id}/10.pt", 5, "f" * 64, attempt=2)
    with session_factory() as session:
        (row,) = checkpoints.list_checkpoints(session, job.id)
    assert (row.key, row.attempt, row.metrics) == (f"{job.id}/10.pt", 2, {})


def test_best_by_val_loss_is_marked_and_kept_when_pruning(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    for step, loss in [(10, 0.9), (20, 0.3), (30, 0.5), (40, 0.6), (50, 0.7), (60, None)]:
        add(session_factory, job.id, step, loss)
    with session_factory() as session:
        assert [c.step for c in checkpoints.list_checkpoints(session, job.id) if c.is_best] == [20]
        prune = checkpoints.checkpoints_to_prune(session, job.id, keep_last=3)
        assert [c.step for c in prune] == [10, 30]
        without_best = checkpoints.checkpoints_to_prune(
            session, job.id, keep_last=3, keep_best_by=None
        )
        assert [c.step for c in without_best] == [10, 20, 30]
        assert checkpoints.checkpoints_to_prune(session, job.id, keep_last=10) == []
    with session_factory.begin() as session:
        assert checkpoints.delete_checkpoint_rows(session, job.id, [c.step for c in prune]) == 2
        assert checkpoints.delete_checkpoint_rows(session, job.id, []) == 0
    with session_factory() as session:
        assert [c.step for c in checkpoints.list_checkpoints(session, job.id)] == [20, 40, 50, 60]
    add(session_factory, job.id, 70, val_loss=0.1)  # a new best moves the mark
    with session_factory() as session:
        assert [c.step for c in checkpoints.list_checkpoints(session, job.id) if c.is_best] == [70]


def test_prune_refuses_to_drop_the_latest(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    with (
        session_factory() as session,
        pytest.raises(ValueError, match="keep_last must be at least 1"),
    ):
        checkpoints.checkpoints_to_prune(session, job.id, keep_last=0)
