"""Worker-side job transitions: claim, lease renewal, progress, finish, hand-back, reaping.

A job never trains twice at once because every transition here is a conditional UPDATE whose
WHERE clause states the only situation in which it is allowed (claim: the job is ``queued``;
or, as a second UPDATE, ``running`` with an expired lease). Concurrent callers are serialised
by the row lock (PostgreSQL) or the write lock (SQLite); at most one of them matches.

Functions here flush but never commit; commit right after each call so other processes see it:
``with session_factory.begin() as session: job = claim_job(session, ...)``.

``attempts`` counts starts: every successful claim adds one, and that number is the
``attempt`` the worker writes on metrics, events and checkpoints. ``restarts`` counts
automatic restarts (a lost lease, a store fault, a lost node of a multi-node job, a hung rank); past
``max_restarts`` the job fails, the error saying so and why.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, true, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from services.jobdb.attempts import close_attempt, open_attempt
from services.jobdb.events import add_event
from services.jobdb.models import Checkpoint, Job, JobAttempt, JobEvent
from services.jobdb.nonfinite import json_safe
from services.jobdb.status import ACTIVE, FINISHED, JobStatus, ordered, resume_hint
from services.jobdb.types import utcnow


def _latest_checkpoint_step() -> Any:
    return select(func.max(Checkpoint.step)).where(Checkpoint.job_id == Job.id).scalar_subquery()


def claim_job(
    session: Session,
    job_id: str,
    worker_id: str,
    host: str | None,
    gpu: str | None,
    lease_timeout_s: float,
    now: datetime | None = None,
    worker_name: str | None = None,
    poison_after: int = 2,
    gang: bool = False,
) -> Job | None:
    """Take the job for ``worker_id``; returns it (status ``running``) or None if not claimable.
    ``worker_name`` (the worker's Celery node name) is recorded on the job and its attempt.
    A multi-node job (spec ``nodes`` > 1) is claimed only by its gang (``gang=True``:
    ``services.jobdb.gangs``), never by one worker alone.

    A takeover that would be the next attempt of a poison job (``poison_after`` lost attempts
    in a row without a checkpoint, this one included: ``reap_expired_leases``) is refused,
    so the reaper fails it with the cause instead.

    Claimable: ``queued``, or ``running`` with an expired lease and restarts left (a takeover
    from a dead worker: counts as a restart, resumes from the latest checkpoint). A cancelled,
    finished or live-leased job returns None: drop the broker message. ``cancelling`` jobs are
    never claimed (the reaper finishes them as ``cancelled`` once their lease expires).
    Writes ``started`` (and ``lease_expired`` on a takeover). Does not commit.
    """
    now = now or utcnow()
    values: dict[str, Any] = dict(
        status=JobStatus.RUNNING,
        attempts=Job.attempts + 1,
        lease_owner=worker_id,
        lease_expires_at=now + timedelta(seconds=lease_timeout_s),
        heartbeat_at=now,
        worker_host=host,
        worker_gpu=gpu,
        worker_name=worker_name,
        started_at=now,
        finished_at=None,
        error=None,
        updated_at=now,
    )
    queued = and_(Job.status == JobStatus.QUEUED, _one_node(gang))
    claimed = _claim_where(session, job_id, queued, values)
    if claimed is None:
        claimed = _take_over(session, job_id, values, host, now, poison_after, gang)
        if claimed is None:
            return None
    _rewind_progress(session, claimed)
    open_attempt(session, claimed, worker_name, now)
    add_event(
        session,
        job_id,
        "started",
        f"attempt {claimed.attempts} started on {host or 'unknown host'}"
        + (f" from checkpoint step {claimed.resume_step}" if claimed.resume_step else ""),
        {"worker": worker_id, "host": host, "gpu": gpu, "resume_step": claimed.resume_step},
        attempt=claimed.attempts,
    )
    return claimed


def _take_over(
    session: Session, job_id: str, values: dict[str, Any], host: str | None, now: datetime,
    poison_after: int, gang: bool,
) -> Job | None:
    """The second way to claim: a ``running`` job whose lease expired, with restarts left, and
    that would not be the next attempt of a poison job. Counts a restart, resumes from the
    latest checkpoint, closes the lost attempt and writes ``lease_expired``."""
    row = session.execute(
        select(Job.worker_host, Job.attempts, Job.resume_step, Job.heartbeat_at,
               _latest_checkpoint_step().label("latest")).where(Job.id == job_id)
    ).one_or_none()
    if row is None:
        return None
    no_progress = row.latest == row.resume_step
    lost = 1 + _lost_in_a_row(session, job_id, row.attempts) if no_progress else 0
    if poison_after and lost >= poison_after:
        return None  # not another attempt: the reaper fails it as poison, with the cause
    expired = and_(
        Job.status == JobStatus.RUNNING, Job.lease_expires_at < now, Job.restarts < Job.max_restarts
    )
    takeover = dict(values, restarts=Job.restarts + 1, resume_step=_latest_checkpoint_step())
    claimed = _claim_where(session, job_id, and_(expired, _one_node(gang)), takeover)
    if claimed is None:
        return None
    add_event(
        session,
        job_id,
        "lease_expired",
        f"lease of {row.worker_host or 'unknown host'} expired; taken over by {host}",
        {"host": row.worker_host, "no_progress": no_progress},
        attempt=claimed.attempts - 1,
    )
    close_attempt(session, job_id, claimed.attempts - 1, "lost", now,
                  last_heartbeat=row.heartbeat_at)
    return claimed


def _one_node(gang: bool) -> Any:
    """Claimable by the caller: any job for a gang, else single-node jobs only (specs of one
    node store no ``nodes``)."""
    if gang:
        return true()
    nodes = Job.spec["nodes"].as_integer()
    return or_(nodes.is_(None), nodes <= 1)


def _rewind_progress(session: Session, job: Job) -> None:
    """The job's progress goes back to the step this attempt starts from: an attempt before it
    may have trained past its latest stored checkpoint (lease lost, store fault) and a resume
    from an older step or from scratch starts earlier still. Progress then shows this attempt's
    own steps only, so its ``end_step`` (``close_attempt``) and ``steps_done`` are its own even
    when it ends before its first step (a checkpoint that cannot be fetched)."""
    progress = dict(job.progress or {})
    step = job.resume_step or 0
    if progress.get("optimizer_step", 0) == step:
        return
    epoch = session.scalar(
        select(Checkpoint.epoch).where(Checkpoint.job_id == job.id, Checkpoint.step == step)
    )
    rewound = {**progress, "optimizer_step": step, "epoch": epoch or 0}
    session.execute(
        update(Job).where(Job.id == job.id).values(progress=rewound)
        .execution_options(synchronize_session=False)
    )
    set_committed_value(job, "progress", rewound)


def _claim_where(
    session: Session, job_id: str, condition: Any, values: dict[str, Any]
) -> Job | None:
    return session.scalars(
        update(Job)
        .where(Job.id == job_id, condition)
        .values(**values)
        .returning(Job)
        .execution_options(populate_existing=True, synchronize_session=False)
    ).one_or_none()


def renew_lease(
    session: Session,
    job_id: str,
    worker_id: str,
    lease_timeout_s: float,
    now: datetime | None = None,
) -> str | None:
    """Extend the lease; returns the job's status (``running``, or ``cancelling`` when a cancel
    was requested: stop within one micro-batch), or None when the lease is lost (the job was
    reaped or taken over): stop at once and write nothing more. Does not commit.
    """
    now = now or utcnow()
    return session.execute(
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == worker_id, Job.status.in_(ordered(ACTIVE)))
        .values(lease_expires_at=now + timedelta(seconds=lease_timeout_s), heartbeat_at=now)
        .returning(Job.status)
        .execution_options(synchronize_session=False)
    ).scalar()


def update_progress(
    session: Session,
    job_id: str,
    progress: dict[str, Any] | None = None,
    latest_metrics: dict[str, Any] | None = None,
    worker_id: str | None = None,
) -> bool:
    """Merge ``progress`` ({epoch, optimizer_step, total_optimizer_steps}) and ``latest_metrics``
    into the job row (a non-finite metric as its label: services/jobdb/nonfinite.py). With ``worker_id`` only while that worker holds the lease (a worker that
    lost its lease cannot overwrite its successor's progress). Returns whether it wrote.
    Does not commit.
    """
    current = session.execute(
        select(Job.progress, Job.latest_metrics).where(Job.id == job_id)
    ).one_or_none()
    if current is None:
        return False
    merged_progress = {**(current.progress or {}), **(progress or {})}
    # A JSON column cannot hold NaN or infinity (PostgreSQL refuses the whole write): labels.
    merged_metrics = {**(current.latest_metrics or {}), **json_safe(latest_metrics or {})}
    query = update(Job).where(Job.id == job_id)
    if worker_id is not None:
        query = query.where(Job.lease_owner == worker_id, Job.status.in_(ordered(ACTIVE)))
    result = session.execute(
        query.values(
            progress=merged_progress, latest_metrics=merged_metrics, updated_at=utcnow()
        ).execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def finish_job(
    session: Session,
    job_id: str,
    worker_id: str,
    status: str,
    error: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> bool:
    """Record the outcome of the worker's attempt: ``succeeded``, ``failed`` (with ``error``
    ``{"type", "message"}``) or ``cancelled``; releases the lease. Returns False (and writes
    nothing) when ``worker_id`` no longer holds the lease. Writes the outcome's event.
    Does not commit.
    """
    if status not in FINISHED:
        raise ValueError(
            f"finish status must be one of {', '.join(ordered(FINISHED))}, got {status!r}"
        )
    if status == JobStatus.FAILED and not (error and "type" in error and "message" in error):
        raise ValueError('a failed job needs error={"type": ..., "message": ...}')
    now = now or utcnow()
    attempt = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == worker_id, Job.status.in_(ordered(ACTIVE)))
        .values(
            status=status,
            error=error if status == JobStatus.FAILED else None,
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
            updated_at=now,
        )
        .returning(Job.attempts)
        .execution_options(synchronize_session=False)
    ).scalar()
    if attempt is None:
        return False
    close_attempt(session, job_id, attempt, status, now)
    messages: dict[str, str] = {JobStatus.SUCCEEDED: "succeeded", JobStatus.CANCELLED: "cancelled by request"}
    message = messages.get(
        status, f"{(error or {}).get('type')}: {(error or {}).get('message')}"
    )
    add_event(session, job_id, status, message, {"error": error} if error else {}, attempt=attempt)
    return True


def hand_back_job(
    session: Session, job_id: str, worker_id: str, now: datetime | None = None
) -> str | None:
    """Return a ``running`` job to ``queued`` because its worker is shutting down: it resumes
    from its latest checkpoint (``resume_step``) on the next worker that claims it, and the
    hand-back does not count as a restart. Returns the job's queue (enqueue there after the
    commit), or None when ``worker_id`` no longer holds the lease or a cancel was requested
    (then finish the job as cancelled instead). Writes ``requeued``. Does not commit.
    """
    now = now or utcnow()
    moved = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == worker_id, Job.status == JobStatus.RUNNING)
        .values(
            status=JobStatus.QUEUED,
            resume_step=_latest_checkpoint_step(),
            lease_owner=None,
            lease_expires_at=None,
            enqueued_at=now,
            updated_at=now,
        )
        .returning(Job.queue, Job.attempts, Job.resume_step)
        .execution_options(synchronize_session=False)
    ).one_or_none()
    if moved is None:
        return None
    close_attempt(session, job_id, moved.attempts, "handed_back", now)
    add_event(
        session,
        job_id,
        "requeued",
        "handed back by its worker, which is shutting down; resumes "
        + (f"from checkpoint step {moved.resume_step}" if moved.resume_step else "from the start"),
        {"resume_step": moved.resume_step, "reason": "worker_shutdown"},
        attempt=moved.attempts,
    )
    return str(moved.queue)


def _poison_error(
    session: Session, job_id: str, attempt: int, lost: int, host: str | None, progress: Any
) -> dict[str, Any]:
    """Why a job is stopped as poison: how many attempts died without a checkpoint, at which
    step, how the last one's process died when its worker saw it (``cause``: exit signal or
    code, the OOM killer) and the last thing it recorded (its last event)."""
    last = session.scalars(
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.attempt == attempt)
        .order_by(JobEvent.id.desc())
        .limit(1)
    ).first()
    last_event = f"{last.kind}: {last.message}" if last is not None else "none recorded"
    died: str | None = session.scalar(
        select(JobAttempt.cause).where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
    )
    step = (progress or {}).get("optimizer_step", 0)
    times = "twice" if lost == 2 else f"{lost} times"
    headline = f"{died} at optimizer step {step} {times} without a new checkpoint: " if died else ""
    return {
        "type": "PoisonJob",
        "reason": "poison",
        "cause": died,
        "last_event": last_event,
        "message": (
            f"{headline}{lost} attempts in a row died without writing a checkpoint (the last on "
            f"host {host or 'unknown'}, at optimizer step {step}; its last event: {last_event}): "
            "a job that kills its worker (out of memory, a crash in native code) would take down "
            "one worker per restart, so it is not restarted again. Fix the cause (a smaller "
            f"micro_batch_size, model or dataset option), then POST /v1/jobs/{job_id}/resume"
        ),
    }


def _lost_in_a_row(session: Session, job_id: str, attempt: int) -> int:
    """How many attempts just before ``attempt`` were lost without progress, in a row (from
    the ``no_progress`` their ``lease_expired`` events recorded)."""
    lost = session.execute(
        select(JobEvent.attempt, JobEvent.data)
        .where(JobEvent.job_id == job_id, JobEvent.kind == "lease_expired",
               JobEvent.attempt < attempt)
        .order_by(JobEvent.attempt.desc())
    ).all()
    count, expected = 0, attempt - 1
    for previous, data in lost:
        if previous != expected or not (data or {}).get("no_progress"):
            break
        count, expected = count + 1, expected - 1
    return count


def reap_expired_leases(
    session: Session, now: datetime | None = None, poison_after: int = 2,
    queues: Collection[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Handle every active job whose lease expired before ``now`` (its worker died).

    ``running`` with restarts left -> ``queued`` (restarts + 1, ``resume_step`` = latest
    checkpoint; the next claim counts the new attempt): enqueue these ids after the commit.
    ``running`` whose last ``poison_after`` attempts (this one included; 0: never) were all
    lost without a new checkpoint -> ``failed`` with reason ``poison`` and the last known
    cause, whatever restarts are left: a job that kills its worker (the kernel's OOM killer)
    would otherwise take one down per restart.
    ``running`` with no restarts left -> ``failed`` with the reason.
    ``cancelling`` -> ``cancelled`` (the cancel was requested; nothing more to run).
    Returns ``(requeued_ids, failed_ids)``. Safe to run in many processes at once: each job
    is moved by one conditional UPDATE. Writes ``lease_expired`` and the outcome's event.
    Does not commit. ``queues``: only jobs on these queues (a worker reaps its own queues,
    with its own settings; the API reaps every queue).
    """
    now = now or utcnow()
    requeued: list[str] = []
    failed: list[str] = []
    for job in _expired_jobs(session, now, queues):
        target = _reaped_to(session, job, now, poison_after)
        moved = session.execute(
            update(Job)
            .where(Job.id == job.id, Job.status == job.status, Job.lease_expires_at < now)
            .values(lease_owner=None, lease_expires_at=None, updated_at=now, **target)
            .returning(Job.status, Job.resume_step)
            .execution_options(synchronize_session=False)
        ).one_or_none()
        if moved is None:
            continue  # another reaper, a renewal or a takeover got there first
        close_attempt(session, job.id, job.attempts, "lost", now)
        add_event(session, job.id, "lease_expired", f"lease of {job.worker_host or 'unknown host'} expired",
                  {"host": job.worker_host, "no_progress": job.latest == job.resume_step},
                  attempt=job.attempts)
        _record_reaped(session, job, moved, target)
        if moved.status == JobStatus.QUEUED:
            requeued.append(job.id)
        elif moved.status == JobStatus.FAILED:
            failed.append(job.id)
    return requeued, failed


def _expired_jobs(session: Session, now: datetime, queues: Collection[str] | None) -> list[Any]:
    """The active jobs (on ``queues``) whose lease expired before ``now``, with what deciding
    their fate needs (restarts, the checkpoint they started from and the latest one)."""
    query = (
        select(Job.id, Job.status, Job.attempts, Job.restarts, Job.max_restarts, Job.worker_host,
               Job.resume_step, _latest_checkpoint_step().label("latest"), Job.progress)
        .where(Job.status.in_(ordered(ACTIVE)), Job.lease_expires_at < now)
    )
    if queues is not None:
        query = query.where(Job.queue.in_(list(queues)))
    return list(session.execute(query.order_by(Job.id)).all())


def _reaped_to(session: Session, job: Any, now: datetime, poison_after: int) -> dict[str, Any]:
    """The columns an expired job moves to: ``cancelled`` (a cancel was requested), ``failed``
    as poison, ``queued`` for a restart, or ``failed`` with no restarts left."""
    # This attempt wrote no checkpoint past the one it started from: it got nowhere.
    no_progress = job.latest == job.resume_step
    lost = 1 + _lost_in_a_row(session, job.id, job.attempts) if no_progress else 0
    if job.status == JobStatus.CANCELLING:
        return {"status": JobStatus.CANCELLED, "finished_at": now}
    if poison_after and lost >= poison_after:
        return {"status": JobStatus.FAILED, "finished_at": now,
                "error": _poison_error(session, job.id, job.attempts, lost, job.worker_host, job.progress)}
    if job.restarts < job.max_restarts:
        return {
            "status": JobStatus.QUEUED,
            "restarts": Job.restarts + 1,
            "resume_step": _latest_checkpoint_step(),
            "enqueued_at": now,  # the reaper enqueues it right after the commit
        }
    return {
        "status": JobStatus.FAILED,
        "finished_at": now,
        "error": {
            "type": "LeaseExpired",
            "reason": "max_restarts",
            "message": (
                f"the worker stopped renewing its lease (last host {job.worker_host or 'unknown'}) "
                f"and the job already restarted {job.restarts} times (max_restarts="
                f"{job.max_restarts}); fix the cause, then {resume_hint(job.id)}"
            ),
        },
    }


def _record_reaped(session: Session, job: Any, moved: Any, target: dict[str, Any]) -> None:
    """The event of a reaped job's outcome: ``requeued``, ``failed`` or ``cancelled``."""
    if moved.status == JobStatus.QUEUED:
        source = (f"from checkpoint step {moved.resume_step}" if moved.resume_step
                  else "from the start")
        add_event(session, job.id, "requeued",
                  f"restart {job.restarts + 1} of {job.max_restarts}, {source}",
                  {"resume_step": moved.resume_step, "restart": job.restarts + 1},
                  attempt=job.attempts)
    elif moved.status == JobStatus.FAILED:
        add_event(session, job.id, "failed", target["error"]["message"],
                  {"error": target["error"]}, attempt=job.attempts)
    else:
        add_event(session, job.id, "cancelled", "cancelled (worker gone)", attempt=job.attempts)


def stale_queued_jobs(
    session: Session, older_than: datetime, limit: int = 100, now: datetime | None = None,
    queues: Collection[str] | None = None, among: Collection[str] | None = None,
) -> list[tuple[str, str]]:
    """``(id, queue)`` of jobs ``queued`` whose broker message was last sent before
    ``older_than`` (``enqueued_at``; never sent counts as stale): the message may be lost (the
    broker was down at submit time, or a worker died between taking it and claiming the job),
    so enqueue them again. Each returned job's ``enqueued_at`` is set to ``now``, so the next
    call skips it until it is stale again: at most one extra message per period for a job that
    merely waits for a free worker (a duplicate is harmless: the claim drops it). In submit
    order (ids grow with time), so they start in that order.
    Safe with many reapers at once: the staleness test is repeated on the row being updated,
    so only one of them gets each job. ``among``: only these jobs. Does not commit.
    """
    now = now or utcnow()
    is_stale = _stale(older_than, queues)
    if among is not None:
        is_stale = and_(is_stale, Job.id.in_(list(among)))
    stale = select(Job.id).where(is_stale).order_by(Job.id).limit(limit)
    rows = session.execute(
        update(Job)
        .where(Job.id.in_(stale.scalar_subquery()), is_stale)
        .values(enqueued_at=now)
        .returning(Job.id, Job.queue)
        .execution_options(synchronize_session=False)
    ).all()
    return sorted((row.id, row.queue) for row in rows)


def stale_queued_ids(
    session: Session, older_than: datetime, queues: Collection[str], limit: int = 100
) -> list[tuple[str, str]]:
    """``(id, queue)`` of the jobs ``stale_queued_jobs`` would send, in submit order, marking
    none: a reaper that must ask the broker first marks them with ``among`` afterwards."""
    rows = session.execute(
        select(Job.id, Job.queue).where(_stale(older_than, queues)).order_by(Job.id).limit(limit)
    ).all()
    return [(row.id, row.queue) for row in rows]


def _stale(older_than: datetime, queues: Collection[str] | None) -> ColumnElement[bool]:
    is_stale = and_(
        Job.status == JobStatus.QUEUED,
        (Job.enqueued_at.is_(None)) | (Job.enqueued_at < older_than),
    )
    if queues is not None:  # a worker's reaper: its own queues, sent through its own broker
        is_stale = and_(is_stale, Job.queue.in_(list(queues)))
    return is_stale


def mark_unsent(session: Session, job_ids: list[str]) -> None:
    """Their broker message could not be sent: ``enqueued_at`` NULL makes them stale for the
    next reaper pass (every ``ACCUM_REAPER_INTERVAL_S``), not one ``ACCUM_REQUEUE_AFTER_S``
    later. Only jobs still ``queued``. Does not commit."""
    session.execute(
        update(Job).where(Job.id.in_(job_ids), Job.status == JobStatus.QUEUED)
        .values(enqueued_at=None).execution_options(synchronize_session=False)
    )


@dataclass(frozen=True)
class Fault:
    """A transient fault that ends an attempt with a restart counted: its ``kind`` (the event
    and the attempt's outcome), the error ``type`` of a job with no restarts left, how the
    requeue event says it (``after``), and what to fix before resuming (``fix``)."""

    kind: str
    type: str
    after: str
    fix: str


STORE_FAULT = Fault("store_fault", "ArtifactStoreError", "a store fault", "once the store is back")
NODE_LOST = Fault(
    "node_lost", "NodeLost", "a lost node",
    "a node of its gang was lost on each of these attempts (a worker died, or a rank failed or "
    "hung past ACCUM_COLLECTIVE_TIMEOUT_S): check the workers' logs and that "
    "ACCUM_RENDEZVOUS_PORTS is open between the nodes, raise max_restarts if nodes come and go "
    "that often, then",
)
# A rank (a spawned one, or a world of 1's training thread in its worker's process) made no
# progress past ACCUM_COLLECTIVE_TIMEOUT_S + a margin: its supervisor ended the attempt
# (services.worker.pulse). Counted as a restart, as a lost node is.
HUNG = Fault(
    "hung", "RankHung", "a hung rank",
    "a rank made no progress past ACCUM_COLLECTIVE_TIMEOUT_S (plus a margin) on each of these "
    "attempts (the events name the node and rank): look for a data loader, a dataset or a model "
    "step that blocks (`accum logs ID`), or raise ACCUM_COLLECTIVE_TIMEOUT_S for slower steps, then",
)


def requeue_after_fault(
    session: Session, job_id: str, worker_id: str, reason: str, now: datetime | None = None,
    fault: Fault = STORE_FAULT,
) -> tuple[str, str] | None:
    """A transient fault stopped the attempt (``STORE_FAULT``: the artifact store unreachable, a
    checkpoint object missing or damaged; ``NODE_LOST``: a node of a multi-node job's gang was
    lost; ``HUNG``: a rank made no progress past its deadline): back to ``queued`` with a
    restart counted and ``resume_step`` = latest checkpoint, or ``failed`` when no restarts are left (max_restarts reached, and why). Returns
    ``("queued", queue)`` (enqueue there after the commit), ``("failed", message)``, or None
    when ``worker_id`` no longer holds the lease or a cancel came first (then finish it as
    cancelled). Closes the attempt (``fault.kind``, or ``failed``); writes ``fault.kind`` and
    the outcome's event. Does not commit.
    """
    now = now or utcnow()
    job = session.execute(
        select(Job.restarts, Job.max_restarts, Job.attempts)
        .where(Job.id == job_id, Job.lease_owner == worker_id, Job.status == "running")
    ).one_or_none()
    if job is None:
        return None
    restarts, max_restarts, attempt = job
    add_event(session, job_id, fault.kind, reason, {"restart": restarts + 1}, attempt=attempt)
    if restarts >= max_restarts:
        message = (f"{reason}; max_restarts reached: the job already restarted {restarts} times "
                   f"(max_restarts={max_restarts}); {fault.fix} POST /v1/jobs/{job_id}/resume "
                   "(`accum resume ID`, or `--from-step K` for an older checkpoint)")
        finished = finish_job(session, job_id, worker_id, "failed",
                              error={"type": fault.type, "reason": "max_restarts", "message": message},
                              now=now)
        return ("failed", message) if finished else None
    moved = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == worker_id, Job.status == "running")
        .values(status="queued", restarts=Job.restarts + 1, resume_step=_latest_checkpoint_step(),
                lease_owner=None, lease_expires_at=None, enqueued_at=now, updated_at=now)
        .returning(Job.queue, Job.resume_step)
        .execution_options(synchronize_session=False)
    ).one()
    close_attempt(session, job_id, attempt, fault.kind, now)
    add_event(
        session, job_id, "requeued",
        f"restart {restarts + 1} of {max_restarts} after {fault.after}, "
        + (f"from checkpoint step {moved.resume_step}" if moved.resume_step else "from the start"),
        {"resume_step": moved.resume_step, "restart": restarts + 1, "reason": fault.kind},
        attempt=attempt,
    )
    return "queued", str(moved.queue)
