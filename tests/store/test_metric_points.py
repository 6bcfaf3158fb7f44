"""Metric reads for the API's hot paths, on SQLite and PostgreSQL: a dashboard's poll of every
name after a step (``since_step`` without ``name``), and a live stream's read of each name
past its own frontier (``read_new_points``), checked against the rows written."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from services.store import Job, metrics
from services.store.metric_points import read_metric_points, read_new_points

NAMES = ("grad_norm", "loss", "lr")


def written(session_factory: sessionmaker[Session], make_job: Callable[..., Job], steps: int) -> str:
    job = make_job()
    rows = [{"name": n, "step": s, "epoch": 0, "value": s / 10} for s in range(1, steps + 1) for n in NAMES]
    rows.append({"name": "val_loss", "step": 5, "epoch": 0, "value": 0.5})
    with session_factory.begin() as session:
        metrics.write_metrics(session, job.id, 1, rows)
    return job.id


def test_since_step_without_a_name_pages_every_name_after_the_step(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job_id = written(session_factory, make_job, steps=10)
    with session_factory() as session:
        first, cursor = read_metric_points(session, job_id, since_step=7, limit=5)
        rest, end = read_metric_points(session, job_id, since_step=7, limit=5, cursor=cursor)
        nothing, _ = read_metric_points(session, job_id, since_step=10)
    got = [(m.name, m.step) for m in first + rest]
    assert got == [(n, s) for n in NAMES for s in (8, 9, 10)]  # val_loss (step 5) is before 7
    assert end is None and nothing == []


def test_new_points_start_past_each_names_frontier(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job_id = written(session_factory, make_job, steps=10)
    frontiers = {"loss": 8, "lr": None, "val_loss": 5, "grad_norm": 10}
    with session_factory() as session:
        rows = read_new_points(session, job_id, frontiers, limit=1000)
        cut = read_new_points(session, job_id, frontiers, limit=3)
        none = read_new_points(session, job_id, {}, limit=1000)
    assert [(m.name, m.step) for m in rows] == [("loss", 9), ("loss", 10)] + [("lr", s) for s in range(1, 11)]
    assert [m.value for m in rows[:2]] == [0.9, 1.0]
    # A cut page keeps (name, step) order: the names after the cut come next time.
    assert [(m.name, m.step) for m in cut] == [("loss", 9), ("loss", 10), ("lr", 1)]
    assert none == []
