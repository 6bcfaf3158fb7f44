"""A job's runs in experiment trackers (``tracker_runs``): written by the worker's tracker
sinks (``services.worker.trackers``), read by the job view.

    run = tracker_runs.open_run(session, job_id, "mlflow")      # created on first use
    tracker_runs.set_identity(session, job_id, "mlflow", run_id, url)
    tracker_runs.mark_delivered(session, job_id, "mlflow", step=120)
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from services.jobdb.models import TrackerRun
from services.jobdb.types import utcnow


def open_run(session: Session, job_id: str, tracker: str) -> TrackerRun:
    """The job's row for ``tracker``, added (nothing delivered) when it has none. Flushes."""
    run = session.get(TrackerRun, (job_id, tracker), populate_existing=True)
    if run is None:
        run = TrackerRun(job_id=job_id, tracker=tracker, delivered_step=-1)
        session.add(run)
        session.flush()
    return run


def set_identity(session: Session, job_id: str, tracker: str, run_id: str, url: str | None) -> None:
    session.execute(update(TrackerRun).where(TrackerRun.job_id == job_id, TrackerRun.tracker == tracker)
                    .values(run_id=run_id, url=url, updated_at=utcnow()))


def mark_delivered(session: Session, job_id: str, tracker: str, step: int) -> None:
    """The tracker has every point up to ``step`` (never moves back) and nothing pending."""
    session.execute(
        update(TrackerRun)
        .where(TrackerRun.job_id == job_id, TrackerRun.tracker == tracker)
        .values(delivered_step=step, undelivered=None, updated_at=utcnow())
        .where(TrackerRun.delivered_step <= step)
    )


def mark_undelivered(session: Session, job_id: str, tracker: str, error: str) -> None:
    session.execute(update(TrackerRun).where(TrackerRun.job_id == job_id, TrackerRun.tracker == tracker)
                    .values(undelivered=error, updated_at=utcnow()))


def runs_of(session: Session, job_id: str) -> list[TrackerRun]:
    return list(session.scalars(select(TrackerRun).where(TrackerRun.job_id == job_id)
                                .order_by(TrackerRun.tracker)))
