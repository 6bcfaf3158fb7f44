"""Jobs as the API sees them: create (idempotent), read, list, cancel, resume.

Worker-side transitions (claim, lease, progress, finish, reaping) are in ``leases``.
Functions here flush but never commit: the caller owns the transaction, and enqueues the
job on the broker only after the commit (``with session_factory.begin() as session: ...``).
Transitions write their lifecycle event in the same transaction.
"""

from __future__ import annotations

import functools
from typing import Any, cast

from sqlalchemy import Table, delete, func, insert, or_, select, update
from sqlalchemy.orm import Session, make_transient_to_detached, selectinload
from sqlalchemy.orm.attributes import set_committed_value

from services.jobdb.cursors import decode_cursor, encode_cursor
from services.jobdb.dialect import insert_for
from services.jobdb.errors import IdempotencyConflict, JobStateError
from services.jobdb.events import add_event
from services.jobdb.models import (
    Checkpoint,
    Job,
    JobEvent,
    JobLogLine,
    Metric,
    MetricBlock,
    Owner,
    TrackerRun,
    short_id_column,
)
from services.jobdb.quotas import confirm_under_cap, near_cap
from services.jobdb.status import ALL, FINISHED, JobStatus, ordered
from services.jobdb.types import ID_LEN, SHORT_LEN, new_id, utcnow

# The one hash of a normalised spec (also re-exported here as jobs.spec_hash).
from services.spec.hashing import spec_hash as spec_hash

# Core statements on the tables, built once: values come as parameters, so each call skips
# the ORM's statement construction and hits the compiled-statement cache.
_INSERT_JOB = insert(cast(Table, Job.__table__))
_INSERT_EVENT = insert(cast(Table, JobEvent.__table__))
# Attribute key -> column name (a Core INSERT takes the table's names: tag_text is "tags").
_COLUMN_NAMES = {a.key: a.columns[0].name for a in Job.__mapper__.column_attrs}


def create_job(
    session: Session,
    *,
    owner: Owner,
    spec: dict[str, Any],
    name: str | None = None,
    queue: str = "default",
    max_restarts: int = 3,
    effective_batch_size: int | None = None,
    total_optimizer_steps: int | None = None,
    idempotency_key: str | None = None,
    max_active_jobs: int | None = None,
    priority: int = 1,
    tags: list[str] | None = None,
    notes: str | None = None,
) -> tuple[Job, bool]:
    """Insert a queued job; returns ``(job, created)``. Does not commit.

    With ``idempotency_key``: the same key and the same (normalised) spec return the existing
    job with ``created=False``; the same key and a different spec raise IdempotencyConflict.
    Safe under concurrent requests with the same key (INSERT ... ON CONFLICT DO NOTHING on the
    unique (owner_id, idempotency_key), then read the winner).
    Writes the ``created`` event when it creates the job.
    With ``max_active_jobs``, a new job that would give the owner more unfinished jobs than
    that raises ActiveJobCapReached (the guarantee under concurrent submits: ``quotas``);
    the caller rolls back. ``tags`` and ``notes``: what the owner says about it (``edit_job``).
    """
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    recount = max_active_jobs is not None and near_cap(session, owner.id, max_active_jobs)
    values = _new_job_row(
        owner, spec, name=name, queue=queue, max_restarts=max_restarts,
        effective_batch_size=effective_batch_size, total_optimizer_steps=total_optimizer_steps,
        idempotency_key=idempotency_key, priority=priority,
    )
    values.update(tag_text=tag_text(tags or []), notes=notes or None)
    # A short id (the id's random tail) names one of the owner's jobs: draw again while it
    # is taken (odds 10,000 / 2**30 at 10,000 jobs; two submits racing for the same
    # tail, 1 in 2**30 each, are not guarded).
    while job_ids_by_short(session, values["id"][-SHORT_LEN:], owner, limit=1):
        values["id"] = new_id()
    job = _insert_job(session, values)
    if job is None:  # another request with this key won: its job, if it has the same spec
        assert idempotency_key is not None  # only a keyed insert can find the row taken
        return _job_of_key(session, owner, idempotency_key, values["spec_hash"]), False
    _add_created_event(session, job)
    if recount:
        assert max_active_jobs is not None
        confirm_under_cap(session, owner.id, max_active_jobs)
    return job, True


def _new_job_row(
    owner: Owner, spec: dict[str, Any], *, name: str | None, queue: str, max_restarts: int,
    effective_batch_size: int | None, total_optimizer_steps: int | None,
    idempotency_key: str | None, priority: int,
) -> dict[str, Any]:
    """Every column of a new queued job."""
    now = utcnow()
    return dict(
        id=new_id(),
        owner_id=owner.id,
        name=name,
        spec=spec,
        spec_hash=spec_hash(spec),
        idempotency_key=idempotency_key,
        status=JobStatus.QUEUED,
        queue=queue,
        attempts=0,
        restarts=0,
        max_restarts=max_restarts,
        effective_batch_size=effective_batch_size,
        progress={"epoch": 0, "optimizer_step": 0, "total_optimizer_steps": total_optimizer_steps},
        latest_metrics={},
        error=None,
        lease_owner=None,
        lease_expires_at=None,
        heartbeat_at=None,
        worker_host=None,
        worker_gpu=None,
        worker_name=None,
        priority=priority,
        resume_step=None,
        # The caller enqueues right after the commit; if that send is lost, the reaper
        # re-sends once this is older than ACCUM_REQUEUE_AFTER_S.
        enqueued_at=now,
        created_at=now,
        started_at=None,
        finished_at=None,
        updated_at=now,
    )


def _insert_job(session: Session, values: dict[str, Any]) -> Job | None:
    """The job inserted with ``values`` and attached to the session; None when its
    idempotency key was taken (by a concurrent request, or earlier)."""
    if values["idempotency_key"] is None:
        # One Core INSERT instead of an ORM flush (the submit hot path).
        session.connection().execute(_INSERT_JOB, {_COLUMN_NAMES[k]: v for k, v in values.items()})
    elif session.execute(
        insert_for(session, Job).values(**values).on_conflict_do_nothing().returning(Job.id)
    ).scalar() is None:
        return None
    # The row is exactly `values` and the columns' defaults: attach it to the session as if
    # loaded, without a SELECT (an attribute left out would be loaded by one on first read).
    job = Job(**values)
    make_transient_to_detached(job)
    for key, value in _left_to_defaults(frozenset(values)).items():
        set_committed_value(job, key, value)
    set_committed_value(job, "attempt_list", [])  # a new job has none: no query to say so
    session.add(job)
    return job


@functools.cache
def _left_to_defaults(given: frozenset[str]) -> dict[str, Any]:
    """The job columns an INSERT of ``given`` leaves to their defaults, with the values the
    INSERT stores: each column's scalar default, or NULL. A column added later joins by itself."""
    left: dict[str, Any] = {}
    for attribute in Job.__mapper__.column_attrs:
        if attribute.key in given:
            continue
        default = attribute.columns[0].default
        if default is not None and not default.is_scalar:
            raise RuntimeError(f"jobs.{attribute.key} has a computed default: _new_job_row must set it")
        left[attribute.key] = default.arg if default is not None else None
    return left


def _job_of_key(session: Session, owner: Owner, idempotency_key: str, digest: str) -> Job:
    """The owner's job stored under ``idempotency_key``; IdempotencyConflict unless its spec
    hashes to ``digest``."""
    job = session.scalars(
        select(Job)
        .where(Job.owner_id == owner.id, Job.idempotency_key == idempotency_key)
        .execution_options(populate_existing=True)
    ).one()
    if job.spec_hash != digest:
        raise IdempotencyConflict(idempotency_key, job.id)
    return job


def _add_created_event(session: Session, job: Job) -> None:
    """The new job's ``created`` event, in one Core INSERT."""
    session.connection().execute(
        _INSERT_EVENT,
        dict(
            job_id=job.id,
            attempt=0,
            kind="created",
            message=f"job {job.id} queued on {job.queue!r}",
            data={"queue": job.queue},
            created_at=job.created_at,
        ),
    )


def get_job(session: Session, job_id: str, owner: Owner) -> Job | None:
    """The job if ``owner`` may see it (its own, or any for an admin), else None (-> 404)."""
    job = session.get(Job, job_id)
    if job is None or (job.owner_id != owner.id and not owner.is_admin):
        return None
    return job


def job_ids_starting_with(
    session: Session, prefix: str, owner: Owner, *, anyones: bool, limit: int
) -> list[str]:
    """Ids (newest first, at most ``limit``) that start with ``prefix``, of ``owner``'s jobs or,
    with ``anyones``, of every job. ``prefix`` holds only id characters, so LIKE sees no
    wildcard in it."""
    query = select(Job.id).where(Job.id.like(f"{prefix}%"))
    if not anyones:
        query = query.where(Job.owner_id == owner.id)
    return list(session.scalars(query.order_by(Job.id.desc()).limit(limit)))


def job_ids_by_short(
    session: Session, prefix: str, owner: Owner | None, *, limit: int
) -> list[str]:
    """Ids (newest first, at most ``limit``) whose short id (``services.jobdb.job_ids``: the last
    ``SHORT_LEN`` characters, random) starts with ``prefix``, of ``owner``'s jobs or, with
    None, of every job. A whole short id is found through ix_jobs_owner_id_short; a shorter
    prefix (rarely typed) scans the owner's jobs."""
    if len(prefix) == SHORT_LEN:
        query = select(Job.id).where(short_id_column == prefix)
    else:
        query = select(Job.id).where(func.substr(Job.id, ID_LEN - SHORT_LEN + 1, len(prefix)) == prefix)
    if owner is not None:
        query = query.where(Job.owner_id == owner.id)
    return list(session.scalars(query.order_by(Job.id.desc()).limit(limit)))


def load_job(session: Session, job_id: str, *, fresh: bool = True) -> Job | None:
    """The job regardless of owner, for the worker and the reaper (never for API routes).

    ``fresh`` re-reads the row even if the session already holds it.
    """
    return session.get(Job, job_id, populate_existing=fresh)


def tag_text(tags: list[str]) -> str:
    """Tags as stored: ``",a,b,"`` (sorted, each once), ``""`` for none."""
    unique = sorted(set(tags))
    return f",{','.join(unique)}," if unique else ""


def edit_job(
    session: Session, job: Job, *, name: str | None = None, tags: list[str] | None = None,
    notes: str | None = None,
) -> None:
    """Change what the owner says about a job (name, tags, notes); its spec and run stay.
    A value left None is kept; ``notes=""`` clears the notes. Does not commit."""
    if name is not None:
        job.name = name
    if tags is not None:
        job.tag_text = tag_text(tags)
    if notes is not None:
        job.notes = notes or None


def list_jobs(
    session: Session,
    owner: Owner,
    status: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    *,
    tags: list[str] | None = None,
    text: str | None = None,
) -> tuple[list[Job], str | None]:
    """One page of the owner's jobs (all jobs for an admin), newest first; with ``tags``, only
    jobs that carry every one; with ``text``, only jobs whose name, notes or a tag contain it
    (any case).

    Keyset pagination on the time-ordered id: ``next_cursor`` is None on the last page.
    Raises ValueError on an unknown status or limit < 1, InvalidCursor on a bad cursor.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    query = select(Job)
    if not owner.is_admin:
        query = query.where(Job.owner_id == owner.id)
    if status is not None:
        if status not in ALL:
            raise ValueError(f"unknown status {status!r}; use one of {', '.join(JobStatus)}")
        query = query.where(Job.status == status)
    for tag in tags or ():
        query = query.where(Job.tag_text.contains(f",{tag},", autoescape=True))
    if text:
        query = query.where(or_(Job.name.icontains(text, autoescape=True),
                                Job.notes.icontains(text, autoescape=True),
                                Job.tag_text.icontains(text, autoescape=True)))
    if cursor is not None:
        (after_id,) = decode_cursor(cursor, (str,))
        query = query.where(Job.id < after_id)
    query = query.options(selectinload(Job.attempt_list))  # one query for the page's attempts
    rows = list(session.scalars(query.order_by(Job.id.desc()).limit(limit + 1)))
    if len(rows) > limit:
        return rows[:limit], encode_cursor(rows[limit - 1].id)
    return rows, None


def _transition(session: Session, job: Job, from_statuses: tuple[str, ...], **values: Any) -> bool:
    """Conditional UPDATE of one job (atomic against workers and other requests); refreshes it."""
    result = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status.in_(from_statuses))
        .values(updated_at=utcnow(), **values)
        .execution_options(synchronize_session=False)
    )
    session.refresh(job)
    return bool(result.rowcount)  # type: ignore[attr-defined]


def request_cancel(session: Session, job: Job) -> Job:
    """Cancel: a queued job becomes ``cancelled`` at once (it will never start); a running one
    becomes ``cancelling`` until its worker stops; ``cancelling`` stays as is.
    A finished job raises JobStateError. Writes ``cancelled`` or ``cancel_requested``.
    Does not commit.
    """
    now = utcnow()
    if _transition(session, job, (JobStatus.QUEUED,), status=JobStatus.CANCELLED, finished_at=now):
        add_event(session, job.id, "cancelled", "cancelled before it started", attempt=job.attempts)
        return job
    if _transition(session, job, (JobStatus.RUNNING,), status=JobStatus.CANCELLING):
        add_event(session, job.id, "cancel_requested", "cancel requested", attempt=job.attempts)
        return job
    if job.status == JobStatus.CANCELLING:
        return job
    raise JobStateError(job.id, job.status, "cancel", (JobStatus.QUEUED, JobStatus.RUNNING))


# What ``POST /resume`` re-queues (a ``succeeded`` job has nothing left to train).
RESUMABLE = (JobStatus.FAILED, JobStatus.CANCELLED)


def request_resume(session: Session, job: Job, max_active_jobs: int | None = None,
                   from_step: int | None = None, from_scratch: bool = False,
                   timeout_s: int | None = None) -> Job:
    """Re-queue a ``failed`` or ``cancelled`` job from its latest checkpoint (``resume_step``;
    None when it has none, so it starts over), from the checkpoint at ``from_step`` (the rows
    of later ones go: a restart must not jump back to them; the worker's orphan sweep deletes
    their objects), or ``from_scratch`` (every checkpoint row goes). Resets the
    automatic-restart budget and the run time counted against the spec's ``timeout``
    (``run_seconds``); ``timeout_s`` replaces that timeout (the caller checks its maximum).
    Other states raise JobStateError; past ``max_active_jobs`` unfinished jobs of the job's owner, ActiveJobCapReached (roll back). Writes ``resumed``.
    Does not commit; enqueue after it. The caller checks that ``from_step`` has a checkpoint.
    """
    recount = max_active_jobs is not None and near_cap(session, job.owner_id, max_active_jobs)
    latest: Any = select(func.max(Checkpoint.step)).where(Checkpoint.job_id == Job.id).scalar_subquery()
    if from_scratch:
        latest = None
    elif from_step is not None:
        latest = from_step
    changed: dict[str, Any] = {"spec": {**job.spec, "timeout": timeout_s}} if timeout_s else {}
    if not _transition(
        session,
        job,
        RESUMABLE,
        status=JobStatus.QUEUED,
        resume_step=latest,
        restarts=0,
        run_seconds=0.0,
        error=None,
        finished_at=None,
        lease_owner=None,
        lease_expires_at=None,
        enqueued_at=utcnow(),  # the caller enqueues after the commit
        **changed,
    ):
        raise JobStateError(job.id, job.status, "resume", RESUMABLE)
    if from_scratch or from_step is not None:
        later = Checkpoint.step > from_step if from_step is not None else Checkpoint.step >= 0
        session.execute(delete(Checkpoint).where(Checkpoint.job_id == job.id, later)
                        .execution_options(synchronize_session=False))
    add_event(
        session,
        job.id,
        "resumed",
        f"re-queued from checkpoint step {job.resume_step}"
        if job.resume_step
        else "re-queued from the start",
        {"resume_step": job.resume_step, **({"timeout": timeout_s} if timeout_s else {})},
        attempt=job.attempts,
    )
    if recount:
        assert max_active_jobs is not None
        confirm_under_cap(session, job.owner_id, max_active_jobs)
    return job


def delete_finished_job(session: Session, job: Job) -> None:
    """Delete a finished job with its checkpoint rows, metrics and events (delete its
    objects in the artifact store first: a failure in between leaves rows to retry with, never
    objects nobody can find). Another state raises JobStateError. Does not commit."""
    gone = session.execute(
        delete(Job).where(Job.id == job.id, Job.status.in_(ordered(FINISHED)))
        .execution_options(synchronize_session=False)
    )
    if not gone.rowcount:  # type: ignore[attr-defined]
        raise JobStateError(job.id, job.status, "delete", ordered(FINISHED))
    # Children explicitly: SQLite enforces ON DELETE CASCADE only with a pragma.
    for model in (Checkpoint, Metric, MetricBlock, JobEvent, JobLogLine, TrackerRun):
        session.execute(delete(model).where(model.job_id == job.id)
                        .execution_options(synchronize_session=False))
    session.expunge(job)


def is_finished(job: Job) -> bool:
    return job.status in FINISHED
