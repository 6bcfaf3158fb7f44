"""Gangs: a ``nodes: n`` job starts on n workers of its queue at once, claimed through the store.

    seat = join_gang(session, job_id, member, lease_timeout_s=60)   # commit right after
    state = gang_state(session, seat)                                # poll until formed

The rule that keeps two gang jobs from each holding part of a queue's workers: a queue has at
most one gang being formed, its row in ``forming_gangs`` (primary key: the queue). A worker
given a gang job's message joins the queue's forming gang, whichever job that is, or starts
one for its job when none forms; the first member is node 0, the leader. Members take node
ranks 0, 1, ... while holding the forming row's lock (``FOR UPDATE`` on PostgreSQL; SQLite has
one writer at a time, and every function here writes before it reads what it decides on).

The member that fills the last place claims the job for node 0 (``claim_job`` with the
leader's lease id: ``running``, the attempt counted) and deletes the forming row, so the queue
forms its next gang. A gang not complete ``form_timeout_s`` after it started is settled by
whoever sees it first (a waiting member, a reaper): with at least ``min_nodes`` members it
starts on those; with fewer its members are released, the job stays queued with a
``gang_released`` event that says why, and its message is sent again after
``ACCUM_REQUEUE_AFTER_S`` (``stale_queued_jobs``): a worker is never held by a gang for longer
than the timeout. The store records membership and the rendezvous endpoint only; the
rendezvous itself is torch.distributed's (``services.worker.gang``).

Functions here flush but never commit.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from services.jobdb.dialect import insert_for
from services.jobdb.events import add_event
from services.jobdb.leases import claim_job
from services.jobdb.models import AttemptMember, FormingGang, Job, JobAttempt, JobEvent
from services.jobdb.status import JobStatus
from services.jobdb.types import utcnow
from services.spec.job import stored
from services.spec.world import enough_ranks


@dataclass(frozen=True)
class Member:
    """A worker offering itself to a gang: its Celery node name, the lease id it would hold the
    job under as node 0 (unique per attempt), its host, its device, and the ranks it offers a
    node (GPUs, or ``--cpu-ranks``; 0: one process)."""

    worker: str
    worker_id: str
    host: str | None = None
    gpu: str | None = None
    ranks: int = 0


@dataclass(frozen=True)
class Seat:
    """A worker's place in a gang: ``job_id`` (the queue's forming gang, which may be another job
    than the message named), the ``attempt`` it will run, its ``node_rank`` of ``nodes``, and
    ``opened``: this join started the gang (invite the other nodes)."""

    job_id: str
    queue: str
    attempt: int
    node_rank: int
    nodes: int
    worker_id: str
    opened: bool = False


@dataclass(frozen=True)
class GangState:
    """What a member polls: ``formed`` (the job runs this attempt), ``nnodes`` (members of the
    formed gang), the endpoint node 0 recorded (None until then), or ``released`` and why."""

    formed: bool
    released: bool
    nnodes: int
    master_addr: str | None = None
    master_port: int | None = None
    reason: str = ""
    master_secret: str = field(default="", repr=False)  # what a rank presents to join the store


def nodes_of(spec: dict[str, Any] | None) -> tuple[int, int]:
    """``(nodes, min_nodes)`` of a stored spec (single-node specs store neither)."""
    return int(stored(spec, "nodes")), int(stored(spec, "min_nodes"))


def join_gang(
    session: Session, job_id: str, member: Member, *, lease_timeout_s: float,
    now: datetime | None = None, poison_after: int = 2,
) -> Seat | None:
    """Give ``member`` a place in its queue's forming gang (started for ``job_id`` when none
    forms). None: drop the message (the job is not queued, the member is in the gang already
    or offers fewer ranks than a node of it runs, or the gang is full). Filling the last place
    claims the job. Does not commit."""
    now = now or utcnow()
    job = session.execute(
        select(Job.queue, Job.status, Job.spec).where(Job.id == job_id)
    ).one_or_none()
    if job is None or job.status != JobStatus.QUEUED or not _fits(job.spec, member):
        return None
    # Written first: on SQLite this takes the write lock before anything below is read.
    session.execute(
        insert_for(session, FormingGang)
        .values(queue=job.queue, job_id=job_id, attempt=_next_attempt(job_id), started_at=now)
        .on_conflict_do_nothing()
    )
    forming = _lock_forming(session, job.queue)
    if forming is None:
        return None  # formed or released between the two statements: the message is stale
    target = session.execute(
        select(Job.status, Job.spec).where(Job.id == forming.job_id)
    ).one()
    if target.status != JobStatus.QUEUED:  # cancelled while it formed: the queue is free again
        _release(session, forming)
        return None
    nodes, _ = nodes_of(target.spec)
    if not _fits(target.spec, member):
        return None
    joined = _members(session, forming)
    if member.worker in {m.worker for m in joined} or len(joined) >= nodes:
        return None
    rank = len(joined)
    session.add(AttemptMember(
        job_id=forming.job_id, attempt=forming.attempt, node_rank=rank, worker=member.worker,
        worker_id=member.worker_id, host=member.host, gpu=member.gpu, joined_at=now,
    ))
    session.flush()
    if rank + 1 == nodes and not _form(session, forming, lease_timeout_s, now, poison_after):
        _release(session, forming)  # cancelled since it was read: nothing to start
        return None
    return Seat(forming.job_id, job.queue, forming.attempt, rank, nodes, member.worker_id,
                opened=rank == 0)


def gang_state(session: Session, seat: Seat) -> GangState:
    """Where the seat's gang stands: formed (with the endpoint once node 0 recorded it),
    released (the reason from its ``gang_released`` event), or still forming."""
    job = session.execute(
        select(Job.status, Job.attempts).where(Job.id == seat.job_id)
    ).one_or_none()
    members = session.scalar(
        select(func.count()).select_from(AttemptMember)
        .where(AttemptMember.job_id == seat.job_id, AttemptMember.attempt == seat.attempt)
    ) or 0
    mine = session.scalar(
        select(AttemptMember.worker_id).where(
            AttemptMember.job_id == seat.job_id, AttemptMember.attempt == seat.attempt,
            AttemptMember.node_rank == seat.node_rank)
    )
    if job is not None and job.attempts >= seat.attempt and mine == seat.worker_id:
        endpoint = session.execute(
            select(JobAttempt.master_addr, JobAttempt.master_port, JobAttempt.rendezvous_secret)
            .where(JobAttempt.job_id == seat.job_id, JobAttempt.attempt == seat.attempt)
        ).one_or_none()
        addr, port, secret = endpoint if endpoint is not None else (None, None, None)
        return GangState(True, False, members, addr, port, master_secret=secret or "")
    if mine == seat.worker_id:
        return GangState(False, False, members)
    return GangState(False, True, members, reason=_release_reason(session, seat))


def record_endpoint(session: Session, job_id: str, attempt: int, addr: str, port: int,
                    secret: str) -> None:
    """Node 0 of a formed gang records where its rendezvous store listens and the secret its
    ranks present there (for the other nodes' workers only). Does not commit."""
    session.execute(
        update(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
        .values(master_addr=addr, master_port=port, rendezvous_secret=secret)
        .execution_options(synchronize_session=False)
    )


def ports_in_use(session: Session, addr: str) -> set[int]:
    """Rendezvous ports recorded on ``addr`` by attempts still open (another gang's store)."""
    return {port for port in session.scalars(
        select(JobAttempt.master_port).where(
            JobAttempt.master_addr == addr, JobAttempt.ended_at.is_(None),
            JobAttempt.master_port.is_not(None))
    ) if port is not None}


def members_of(session: Session, job_id: str, attempt: int | None = None) -> list[AttemptMember]:
    """The nodes of the job's ``attempt`` (default: its latest attempt with members), by rank."""
    if attempt is None:
        attempt = session.scalar(
            select(func.max(AttemptMember.attempt)).where(AttemptMember.job_id == job_id)
        )
        if attempt is None:
            return []
    return list(session.scalars(
        select(AttemptMember)
        .where(AttemptMember.job_id == job_id, AttemptMember.attempt == attempt)
        .order_by(AttemptMember.node_rank)
    ))


def settle_gang(
    session: Session, queue: str, *, form_timeout_s: float, lease_timeout_s: float,
    now: datetime | None = None, poison_after: int = 2,
) -> str | None:
    """The queue's forming gang, if it started ``form_timeout_s`` before ``now``: started on
    the members it has when they are at least ``min_nodes`` (returns ``"formed"``), else
    released with a ``gang_released`` event (``"released"``). None: nothing to settle.
    Safe from many processes at once (the forming row's lock). Does not commit."""
    now = now or utcnow()
    # A write first (SQLite's lock), then the row under its lock (PostgreSQL).
    session.execute(
        update(FormingGang).where(FormingGang.queue == queue).values(queue=FormingGang.queue).execution_options(synchronize_session=False)
    )
    forming = _lock_forming(session, queue)
    if forming is None or forming.started_at > now - timedelta(seconds=form_timeout_s):
        return None
    spec = session.scalar(select(Job.spec).where(Job.id == forming.job_id))
    nodes, min_nodes = nodes_of(spec)
    joined = _members(session, forming)
    if len(joined) >= min_nodes and _form(session, forming, lease_timeout_s, now, poison_after):
        return "formed"
    add_event(
        session, forming.job_id, "gang_released",
        f"{len(joined)} of {nodes} workers of queue {queue!r} joined its gang within "
        f"{form_timeout_s:g} s (ACCUM_GANG_FORM_TIMEOUT_S; min_nodes {min_nodes}): released "
        f"them; the job waits for {min_nodes} workers of the queue free together. Start more "
        f"(`accum worker --queues {queue}` on {min_nodes - len(joined)} more node"
        f"{'s' if min_nodes - len(joined) != 1 else ''}), or lower min_nodes",
        {"joined": [m.worker for m in joined], "nodes": nodes, "min_nodes": min_nodes,
         "timeout_s": form_timeout_s},
        attempt=forming.attempt,
    )
    _release(session, forming)
    session.execute(
        update(Job).where(Job.id == forming.job_id, Job.status == JobStatus.QUEUED)
        .values(enqueued_at=now).execution_options(synchronize_session=False)
    )
    return "released"


def settle_stale_gangs(
    session: Session, *, form_timeout_s: float, lease_timeout_s: float,
    now: datetime | None = None, poison_after: int = 2, queues: Collection[str] | None = None,
) -> dict[str, str]:
    """``settle_gang`` for every queue (of ``queues``) whose gang formed for too long (its
    members died, or nobody polls it): ``{queue: "formed" | "released"}``. Does not commit."""
    now = now or utcnow()
    query = select(FormingGang.queue).where(
        FormingGang.started_at <= now - timedelta(seconds=form_timeout_s))
    if queues is not None:
        query = query.where(FormingGang.queue.in_(list(queues)))
    settled = {}
    for queue in session.scalars(query).all():
        outcome = settle_gang(session, queue, form_timeout_s=form_timeout_s,
                              lease_timeout_s=lease_timeout_s, now=now, poison_after=poison_after)
        if outcome is not None:
            settled[queue] = outcome
    return settled


def _fits(spec: dict[str, Any] | None, member: Member) -> bool:
    """Whether ``member`` offers the ranks one node of this job runs (``gpus``)."""
    return enough_ranks(int(stored(spec, "gpus")), member.ranks)


def _next_attempt(job_id: str) -> Any:
    return select(Job.attempts + 1).where(Job.id == job_id).scalar_subquery()


def _lock_forming(session: Session, queue: str) -> FormingGang | None:
    return session.scalars(
        select(FormingGang).where(FormingGang.queue == queue).with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()


def _members(session: Session, forming: FormingGang) -> list[AttemptMember]:
    return members_of(session, forming.job_id, forming.attempt)


def _form(
    session: Session, forming: FormingGang, lease_timeout_s: float, now: datetime,
    poison_after: int,
) -> bool:
    """Claim the job for node 0 and free the queue for its next gang. False: not claimable
    (cancelled, or refused as poison): the caller releases the members."""
    members = _members(session, forming)
    leader = members[0]
    job = claim_job(
        session, forming.job_id, leader.worker_id, leader.host, leader.gpu, lease_timeout_s,
        now=now, worker_name=leader.worker, poison_after=poison_after, gang=True,
    )
    if job is None:
        return False
    if job.attempts != forming.attempt:  # counted differently since it started forming
        session.execute(
            update(AttemptMember)
            .where(AttemptMember.job_id == forming.job_id, AttemptMember.attempt == forming.attempt)
            .values(attempt=job.attempts).execution_options(synchronize_session=False)
        )
    session.execute(delete(FormingGang).where(FormingGang.queue == forming.queue))
    nodes, _ = nodes_of(job.spec)
    add_event(
        session, job.id, "gang_formed",
        f"{len(members)} of {nodes} nodes: "
        + ", ".join(f"node {m.node_rank} {m.worker} ({m.host or 'unknown host'})" for m in members),
        {"nodes": nodes, "members": [{"node_rank": m.node_rank, "worker": m.worker, "host": m.host}
                                     for m in members]},
        attempt=job.attempts,
    )
    return True


def _release(session: Session, forming: FormingGang) -> None:
    session.execute(
        delete(AttemptMember)
        .where(AttemptMember.job_id == forming.job_id, AttemptMember.attempt == forming.attempt)
    )
    session.execute(delete(FormingGang).where(FormingGang.queue == forming.queue))


def _release_reason(session: Session, seat: Seat) -> str:
    event = session.scalar(
        select(JobEvent.message)
        .where(JobEvent.job_id == seat.job_id, JobEvent.kind == "gang_released",
               JobEvent.attempt == seat.attempt)
        .order_by(JobEvent.id.desc()).limit(1)
    )
    return str(event or "the gang was released before it formed (the job was cancelled or "
               "claimed otherwise)")
