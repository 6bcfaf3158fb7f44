"""Several processes writing one database at once (API, workers, reaper) all succeed. On SQLite
this is what WAL plus the busy timeout are for: without them writers fail with "database is
locked"."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import events, jobs, leases, metrics
from services.jobdb.db import make_engine, make_session_factory
from services.jobdb.models import Job
from services.jobdb.types import utcnow
from services.settings import Settings

ROUNDS = 30


def hammer(settings: Settings, job_id: str, worker: str, kind: str) -> None:
    """One process's share: worker-style batches, API-style reads and writes, reaping."""
    engine = make_engine(settings)
    sessions = make_session_factory(engine)
    try:
        for i in range(ROUNDS):
            if kind == "worker":
                with sessions.begin() as session:
                    rows = metrics.metric_rows(
                        i + 1, 0, {f"{worker}_loss": 1.0 / (i + 1), "lr": 0.1}
                    )
                    metrics.write_metrics(session, job_id, 1, rows)
                    leases.update_progress(
                        session, job_id, {"optimizer_step": i + 1}, {"loss": 1.0}
                    )
                with sessions.begin() as session:
                    leases.renew_lease(session, job_id, "nobody", 60)
            elif kind == "api":
                with sessions.begin() as session:
                    job = jobs.load_job(session, job_id)
                    assert job is not None
                    metrics.read_metrics(session, job_id, limit=50)
                    events.add_event(session, job_id, "checkpoint", f"{worker} {i}")
            else:
                with sessions.begin() as session:
                    leases.reap_expired_leases(session, utcnow() - timedelta(days=1))
    finally:
        engine.dispose()


def test_processes_write_concurrently_without_lock_errors(
    store_settings: Settings,
    session_factory: sessionmaker[Session],
    make_job: Callable[..., Job],
) -> None:
    job = make_job()
    context = multiprocessing.get_context("fork")
    plan = [("w1", "worker"), ("w2", "worker"), ("a1", "api"), ("a2", "api"), ("r", "reaper")]
    processes = [
        context.Process(target=hammer, args=(store_settings, job.id, w, k)) for w, k in plan
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0] * len(plan)
    with session_factory() as session:
        rows, _ = metrics.read_metrics(session, job.id, limit=10_000)
        assert len(rows) == 3 * ROUNDS  # w1_loss, w2_loss and the shared lr, once per step
        assert len(events.list_events(session, job.id, limit=1000)) == 1 + 2 * ROUNDS
