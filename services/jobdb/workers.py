"""The worker registry: each worker's row (``register``, ``renew``, ``mark_stopped``), how it
is read (``list_workers``, with its state and current job), and what the fleet offers a
queue (``queue_offer``: the submit checks in ``services.fleet``).

A worker is ``stopped`` after a clean shutdown, ``lost`` when its ``last_seen`` is older
than the lease timeout (it died, or its node did), else ``busy`` (a job of its holds a
lease) or ``idle``. The state is decided when read, from the clock, so a dead worker needs
nobody to mark it. Functions here flush but never commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from services.jobdb.dialect import insert_for
from services.jobdb.models import Job, Worker
from services.jobdb.status import ACTIVE, ordered
from services.jobdb.types import utcnow

WORKER_STATES = ("idle", "busy", "lost", "stopped")
# Rows of workers gone for longer than this are deleted when a worker registers: a fleet that
# restarts workers under new names (pids in them) must not grow the table forever.
FORGET_AFTER = timedelta(days=30)


def register(session: Session, values: dict[str, Any], now: datetime | None = None) -> None:
    """Insert or replace the worker's row (``values`` holds every column but the times): a
    worker restarted under the same name starts afresh. Does not commit."""
    now = now or utcnow()
    row = {**values, "started_at": now, "last_seen": now, "stopped_at": None}
    statement = insert_for(session, Worker).values(**row)
    changed = {k: statement.excluded[k] for k in row if k != "name"}
    session.execute(statement.on_conflict_do_update(index_elements=["name"], set_=changed))
    session.execute(delete(Worker).where(Worker.last_seen < now - FORGET_AFTER))


def renew(session: Session, name: str, now: datetime | None = None) -> bool:
    """The worker's heartbeat; False when its row is gone (then register again)."""
    result = session.execute(
        update(Worker)
        .where(Worker.name == name)
        .values(last_seen=now or utcnow(), stopped_at=None)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def mark_stopped(session: Session, name: str, now: datetime | None = None) -> None:
    """A clean shutdown: the worker is listed as ``stopped``, not ``lost``."""
    now = now or utcnow()
    session.execute(
        update(Worker)
        .where(Worker.name == name)
        .values(last_seen=now, stopped_at=now)
        .execution_options(synchronize_session=False)
    )


@dataclass(frozen=True)
class WorkerView:
    """A worker as listed: its row, its state and the job it runs."""

    row: Worker
    state: str
    current_job: str | None
    heartbeat_age_s: float


def state_of(row: Worker, busy: bool, now: datetime, lease_timeout_s: float) -> str:
    if row.stopped_at is not None:
        return "stopped"
    if row.last_seen < now - timedelta(seconds=lease_timeout_s):
        return "lost"
    return "busy" if busy else "idle"


def list_workers(
    session: Session, lease_timeout_s: float, now: datetime | None = None
) -> list[WorkerView]:
    """Every registered worker, by name, with its state and current job."""
    now = now or utcnow()
    rows = list(session.scalars(select(Worker).order_by(Worker.name)))
    # A worker's current job: the active job it claimed (its Celery name is on the job).
    running = dict(
        session.execute(
            select(Job.worker_name, Job.id).where(
                Job.status.in_(ordered(ACTIVE)), Job.worker_name.in_([r.name for r in rows])
            )
        ).all()
    )
    views = []
    for row in rows:
        state = state_of(row, row.name in running, now, lease_timeout_s)
        job = running.get(row.name) if state == "busy" else None
        views.append(WorkerView(row, state, job, (now - row.last_seen).total_seconds()))
    return views


def idle_workers(session: Session, lease_timeout_s: float, now: datetime | None = None) -> dict[str, int]:
    """Per queue, its live workers that hold no job (``list_workers``' ``idle``). One that took a
    message and has not claimed its job yet counts as idle too: ask the broker before acting."""
    idle: dict[str, int] = {}
    for view in list_workers(session, lease_timeout_s, now):
        if view.state == "idle":
            for queue in view.row.queues or []:
                idle[queue] = idle.get(queue, 0) + 1
    return idle


def ranks_offered(gpus: int | None, devices: list[dict[str, Any]] | None) -> int:
    """The DDP ranks one worker offers a job: its GPUs, else the CPU ranks it registered
    (``accum worker --cpu-ranks K``: ``"ranks"`` on its CPU device); 0 = one process only."""
    cpu = [int(d.get("ranks") or 0) for d in devices or [] if d.get("kind") == "cpu"]
    return gpus or max(cpu, default=0)


@dataclass
class QueueOffer:
    """What the workers seen on a queue within the grace period offer: the most GPUs one of
    them has, the most ranks (GPUs, or CPU ranks) one of them offers a job, and the models,
    datasets and plugins any of them can build."""

    workers: int = 0
    ranks: list[int] = field(default_factory=list)  # what each worker offers (multi-node jobs)
    live: int = 0  # workers not stopped (what an error message counts; a stopped one may return)
    live_ranks: int = 0  # the most ranks one of those offers
    max_gpus: int = 0
    max_ranks: int = 0
    models: set[str] = field(default_factory=set)
    datasets: set[str] = field(default_factory=set)
    plugins: set[str] = field(default_factory=set)


def queue_offers(session: Session, seen_since: datetime) -> dict[str, QueueOffer]:
    """Per queue, what its workers seen since ``seen_since`` offer (a stopped worker counts:
    it served the queue, and an autoscaler may bring it back). Empty: no worker registered
    in that time."""
    offers: dict[str, QueueOffer] = {}
    rows = session.execute(
        select(Worker.queues, Worker.gpus, Worker.devices, Worker.models, Worker.datasets,
               Worker.plugins, Worker.stopped_at).where(Worker.last_seen >= seen_since)
    ).all()
    for queues, gpus, devices, models, datasets, plugins, stopped_at in rows:
        for queue in queues or []:
            offer = offers.setdefault(queue, QueueOffer())
            offer.workers += 1
            if stopped_at is None:
                offer.live += 1
                offer.live_ranks = max(offer.live_ranks, ranks_offered(gpus, devices))
            offer.ranks.append(ranks_offered(gpus, devices))
            offer.max_gpus = max(offer.max_gpus, gpus or 0)
            offer.max_ranks = max(offer.max_ranks, ranks_offered(gpus, devices))
            offer.models.update(models or [])
            offer.datasets.update(datasets or [])
            offer.plugins.update(plugins or [])
    return offers
