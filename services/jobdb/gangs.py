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

The timeout is the last resort, not the rule, for members the worker registry knows
(``fresh_s`` given: ``free_workers``, the live workers of the queue that offer a node's ranks
and hold nothing): a gang that can never form now (its members and the free workers are fewer
than ``min_nodes``) is not opened, or is released at once, so it holds no idle worker that a
runnable job could use (event ``gang_waiting``: who is busy); ``resend_formable`` sends its
message again once ``min_nodes`` workers are free together. A gang with ``min_nodes`` members
and no free worker left to wait for starts at once (after a lost node: the survivors, as soon
as the lost worker's registry row went stale).

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
from services.jobdb.models import AttemptMember, FormingGang, Job, JobAttempt, JobEvent, Worker
from services.jobdb.status import ACTIVE, JobStatus, ordered
from services.jobdb.types import utcnow
from services.jobdb.workers import ranks_offered
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
    now: datetime | None = None, poison_after: int = 2, fresh_s: float | None = None,
) -> Seat | None:
    """Give ``member`` a place in its queue's forming gang (started for ``job_id`` when none
    forms). None: drop the message (the job is not queued, the member is in the gang already
    or offers fewer ranks than a node of it runs, or the gang is full; or, with ``fresh_s``,
    no gang forms since too few workers of the queue are free: ``gang_waiting``). Filling the
    last place claims the job, as does ``min_nodes`` with nobody free left to wait for (with
    ``fresh_s``: a registry row renewed within it counts as live). Does not commit."""
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
    early = _early(session, forming, target.spec, now, fresh_s) if rank + 1 < nodes else None
    if early == "release" and rank == 0:
        # Opened by this message and cannot form now: no gang, no invitations, no worker held.
        _waiting(session, forming, target.spec, now, fresh_s or 0.0)
        _release(session, forming)
        return None
    if early == "release":
        _released_early(session, forming, target.spec, now, fresh_s or 0.0)
        return None
    if (rank + 1 == nodes or early == "form") and not _form(
            session, forming, lease_timeout_s, now, poison_after):
        _release(session, forming)  # cancelled since it was read: nothing to start
        return None
    return Seat(forming.job_id, job.queue, forming.attempt, rank, nodes, member.worker_id,
                opened=rank == 0 and early != "form")


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
    now: datetime | None = None, poison_after: int = 2, fresh_s: float | None = None,
) -> str | None:
    """The queue's forming gang, if it started ``form_timeout_s`` before ``now``: started on
    the members it has when they are at least ``min_nodes`` (returns ``"formed"``), else
    released with a ``gang_released`` event (``"released"``). With ``fresh_s`` (a member
    polls), sooner where waiting cannot help (``_early``): started once it has ``min_nodes``
    members and no free worker of the queue is left to join, released once its members and
    the free workers are fewer than ``min_nodes``. None: nothing to settle.
    Safe from many processes at once (the forming row's lock). Does not commit."""
    now = now or utcnow()
    # A write first (SQLite's lock), then the row under its lock (PostgreSQL).
    session.execute(
        update(FormingGang).where(FormingGang.queue == queue).values(queue=FormingGang.queue).execution_options(synchronize_session=False)
    )
    forming = _lock_forming(session, queue)
    if forming is None:
        return None
    spec = session.scalar(select(Job.spec).where(Job.id == forming.job_id))
    if forming.started_at > now - timedelta(seconds=form_timeout_s):
        early = _early(session, forming, spec, now, fresh_s)
        if early == "form" and _form(session, forming, lease_timeout_s, now, poison_after):
            return "formed"
        if early == "release":
            _released_early(session, forming, spec, now, fresh_s or 0.0)
            return "released"
        return None
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


def live_within(heartbeat_interval_s: float) -> float:
    """How recently a worker's registry row must have been renewed (every heartbeat interval,
    ``services.worker.registry``) for a gang to count it as live: three beats, at least 2 s. A
    killed worker is out of the count this long after its last beat, so the survivors of a lost
    node form their next gang then, not after ACCUM_GANG_FORM_TIMEOUT_S."""
    return max(3 * heartbeat_interval_s, 2.0)


def free_workers(
    session: Session, queue: str, spec: dict[str, Any] | None, *, now: datetime, fresh_s: float,
) -> tuple[list[str], dict[str, str]]:
    """Who could join a gang of ``spec`` on ``queue`` now, from the worker registry: ``(free,
    busy)``. Free: registered on the queue, not stopped, its row renewed within ``fresh_s``
    (every heartbeat interval: a killed worker is out within ``fresh_s``), offering the ranks a
    node runs, and holding nothing: no active job's lease, no node of a running gang's current
    attempt, no seat in a forming gang. ``busy``: the other live ones of the queue that fit,
    with what holds them (a job id)."""
    gpus = int(stored(spec, "gpus"))
    rows = session.execute(
        select(Worker.name, Worker.queues, Worker.gpus, Worker.devices).where(
            Worker.stopped_at.is_(None), Worker.last_seen >= now - timedelta(seconds=fresh_s))
    ).all()
    fit = sorted(row.name for row in rows if queue in (row.queues or [])
                 and enough_ranks(gpus, ranks_offered(row.gpus, row.devices)))
    if not fit:
        return [], {}
    active = ordered(ACTIVE)
    holding = [
        select(Job.worker_name, Job.id).where(Job.status.in_(active), Job.worker_name.in_(fit)),
        select(AttemptMember.worker, AttemptMember.job_id)  # a node of a running gang
        .join(Job, Job.id == AttemptMember.job_id)
        .where(AttemptMember.worker.in_(fit), Job.status.in_(active),
               AttemptMember.attempt == Job.attempts),
        select(AttemptMember.worker, AttemptMember.job_id)  # a seat in a forming gang
        .join(FormingGang, (FormingGang.job_id == AttemptMember.job_id)
              & (FormingGang.attempt == AttemptMember.attempt))
        .where(AttemptMember.worker.in_(fit)),
    ]
    held: dict[str, str] = {}
    for query in holding:
        held.update((str(name), str(job)) for name, job in session.execute(query).all())
    return [name for name in fit if name not in held], held


def _early(
    session: Session, forming: FormingGang, spec: dict[str, Any] | None, now: datetime,
    fresh_s: float | None,
) -> str | None:
    """What the forming gang should do before its timeout: ``"form"`` (``min_nodes`` members,
    nobody free left to join), ``"release"`` (members and free workers together fewer than
    ``min_nodes``: waiting holds workers for nothing), None (wait: free workers may still
    join). Only for gangs whose members the registry knows (a member that never registered
    waits for the timeout, as before)."""
    if fresh_s is None:
        return None
    joined = [m.worker for m in _members(session, forming)]
    known = set(session.scalars(select(Worker.name).where(Worker.name.in_(joined))))
    if not known:
        return None
    free, _ = free_workers(session, forming.queue, spec, now=now, fresh_s=fresh_s)
    free = [name for name in free if name not in joined]
    _, min_nodes = nodes_of(spec)
    if len(joined) >= min_nodes and not free:
        return "form"
    if len(joined) + len(free) < min_nodes:
        return "release"
    return None


def _shortage(session: Session, forming: FormingGang, spec: dict[str, Any] | None,
              now: datetime, fresh_s: float) -> tuple[str, dict[str, Any]]:
    """Why the gang cannot form now, for an event: who is free, who is busy with what."""
    nodes, min_nodes = nodes_of(spec)
    joined = [m.worker for m in _members(session, forming)]
    free, busy = free_workers(session, forming.queue, spec, now=now, fresh_s=fresh_s)
    free = sorted(set(free) | set(joined))
    busy = {name: job for name, job in busy.items() if name not in joined}
    held = ", ".join(f"{name} (job {job})" for name, job in sorted(busy.items())) or "none"
    message = (
        f"{len(free)} of the {min_nodes} workers it needs (min_nodes; nodes {nodes}) are free on "
        f"queue {forming.queue!r} ({', '.join(free) or 'none'}; busy: {held}): it holds no "
        f"worker meanwhile, and its message is sent again once {min_nodes} are free together"
    )
    return message, {"free": free, "busy": busy, "nodes": nodes, "min_nodes": min_nodes}


def _waiting(session: Session, forming: FormingGang, spec: dict[str, Any] | None,
             now: datetime, fresh_s: float) -> None:
    """A ``gang_waiting`` event, unless the job's latest event says so already (its message
    comes back every few seconds while it waits)."""
    message, data = _shortage(session, forming, spec, now, fresh_s)
    latest = session.execute(
        select(JobEvent.kind, JobEvent.message).where(JobEvent.job_id == forming.job_id)
        .order_by(JobEvent.id.desc()).limit(1)
    ).one_or_none()
    if latest is None or tuple(latest) != ("gang_waiting", f"waits: {message}"):
        add_event(session, forming.job_id, "gang_waiting", f"waits: {message}", data,
                  attempt=forming.attempt)
    session.execute(  # its message was taken: the next is due one resend period from now
        update(Job).where(Job.id == forming.job_id, Job.status == JobStatus.QUEUED)
        .values(enqueued_at=now).execution_options(synchronize_session=False)
    )


def _released_early(session: Session, forming: FormingGang, spec: dict[str, Any] | None,
                    now: datetime, fresh_s: float) -> None:
    """Release a forming gang that cannot complete now (a free worker it counted on took
    another job, or died): its members go back to their queues at once, with the reason."""
    message, data = _shortage(session, forming, spec, now, fresh_s)
    joined = [m.worker for m in _members(session, forming)]
    add_event(session, forming.job_id, "gang_released", f"released {', '.join(joined)}: {message}",
              {**data, "joined": joined}, attempt=forming.attempt)
    _release(session, forming)
    session.execute(
        update(Job).where(Job.id == forming.job_id, Job.status == JobStatus.QUEUED)
        .values(enqueued_at=now).execution_options(synchronize_session=False)
    )


def formable_jobs(session: Session, queues: Collection[str] | None, *, older_than: datetime,
                  now: datetime, fresh_s: float) -> list[str]:
    """Queued gang jobs (on ``queues``) whose message is older than ``older_than`` and that
    could form now: no gang forms on their queue and at least ``min_nodes`` workers of it are
    free together (``free_workers``). In submit order; the reaper sends their messages again."""
    query = select(Job.id, Job.queue, Job.spec).where(
        Job.status == JobStatus.QUEUED, Job.spec["nodes"].as_integer() > 1,
        (Job.enqueued_at.is_(None)) | (Job.enqueued_at < older_than),
        ~Job.queue.in_(select(FormingGang.queue)),
    ).order_by(Job.id).limit(100)
    if queues is not None:
        query = query.where(Job.queue.in_(list(queues)))
    found = []
    for job_id, queue, spec in session.execute(query).all():
        _, min_nodes = nodes_of(spec)
        if len(free_workers(session, queue, spec, now=now, fresh_s=fresh_s)[0]) >= min_nodes:
            found.append(job_id)
    return found


@dataclass(frozen=True)
class Leader:
    """What a follower reads of its gang's node 0: the job's lease as node 0 last renewed it,
    and node 0's worker's registry row (None: no row)."""

    running: bool  # the job still runs the follower's attempt
    lease_owner: str | None
    lease_expires_at: datetime | None
    worker: str | None
    last_seen: datetime | None
    queue: str


def leader_of(session: Session, job_id: str, attempt: int) -> Leader:
    """The lease and registry row of the node 0 of the job's ``attempt``."""
    job = session.execute(
        select(Job.status, Job.attempts, Job.lease_owner, Job.lease_expires_at, Job.worker_name, Job.queue)
        .where(Job.id == job_id)
    ).one_or_none()
    if job is None:
        return Leader(False, None, None, None, None, "")
    seen = session.scalar(select(Worker.last_seen).where(
        Worker.name == job.worker_name, Worker.stopped_at.is_(None))) if job.worker_name else None
    return Leader(job.status == JobStatus.RUNNING and job.attempts == attempt, job.lease_owner,
                  job.lease_expires_at, job.worker_name, seen, job.queue)


def leader_silent(leader: Leader, *, now: datetime, fresh_s: float, lease_timeout_s: float) -> bool:
    """Whether node 0 renewed neither its lease nor its worker's registry row within
    ``fresh_s``: both threads of its worker process silent (dead, frozen, or cut off from the
    database). ``lease_timeout_s``: what a renewal adds to ``lease_expires_at``."""
    fresh = timedelta(seconds=fresh_s)
    renewed = (leader.lease_expires_at - timedelta(seconds=lease_timeout_s)
               if leader.lease_expires_at is not None else None)
    return ((renewed is None or renewed <= now - fresh)
            and (leader.last_seen is None or leader.last_seen <= now - fresh))


def silent_leaders(
    session: Session, queues: Collection[str], *, now: datetime, fresh_s: float, lease_timeout_s: float,
) -> list[tuple[str, int, Leader, str, int]]:
    """Running gang jobs (on ``queues``) whose node 0 is silent (``leader_silent``), with the
    rendezvous endpoint its attempt recorded: ``(job_id, attempt, leader, addr, port)``."""
    rows = session.execute(
        select(Job.id, Job.attempts, JobAttempt.master_addr, JobAttempt.master_port)
        .join(JobAttempt, (JobAttempt.job_id == Job.id) & (JobAttempt.attempt == Job.attempts))
        .where(Job.status == JobStatus.RUNNING, Job.spec["nodes"].as_integer() > 1,
               Job.queue.in_(list(queues)), JobAttempt.master_port.is_not(None),
               Job.lease_expires_at < now + timedelta(seconds=lease_timeout_s - fresh_s))
    ).all()
    found = []
    for job_id, attempt, addr, port in rows:
        leader = leader_of(session, job_id, attempt)
        if addr and port is not None and leader.running and leader_silent(leader, now=now, fresh_s=fresh_s,
                                                     lease_timeout_s=lease_timeout_s):
            found.append((job_id, attempt, leader, addr, int(port)))
    return found


def end_lost_leader_lease(
    session: Session, job_id: str, attempt: int, leader: Leader, *, now: datetime, message: str,
) -> bool:
    """Expire node 0's lease now, unless it was renewed since ``leader`` was read (the same
    conditional write as a renewal): the reaper then re-queues the job as after any lost lease
    (``reap_expired_leases``: attempt closed ``lost``, a restart counted). Writes a
    ``leader_lost`` event saying why. Does not commit."""
    moved = session.execute(
        update(Job).where(
            Job.id == job_id, Job.status == JobStatus.RUNNING, Job.attempts == attempt,
            Job.lease_owner == leader.lease_owner, Job.lease_expires_at == leader.lease_expires_at,
        ).values(lease_expires_at=now - timedelta(microseconds=1))
        .execution_options(synchronize_session=False)
    )
    if not moved.rowcount:  # type: ignore[attr-defined]
        return False
    add_event(session, job_id, "leader_lost", message,
              {"worker": leader.worker, "lease_owner": leader.lease_owner}, attempt=attempt)
    return True


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
