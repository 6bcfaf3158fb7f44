"""A worker's side of a multi-node (``nodes: n``) job: take a seat in its gang, wait for the
gang, get the rendezvous endpoint. What the launcher calls before it spawns its local ranks:

    seat = claim_seat(settings, job_id, worker_name)          # None: drop the message
    place = wait_for_gang(settings, seat)                     # blocks; GangNotFormed on timeout
    # place.node_rank, place.nnodes, place.master_addr, place.master_port: global rank of local
    # rank r is node_rank * gpus + r; world size nnodes * gpus; every rank joins the store there.
    place.close()                                             # node 0, once the attempt ended

The store decides who is in the gang (``services.jobdb.gangs``). Node 0's worker serves the
rendezvous itself, torch.distributed's TCPStore (``services.worker.rendezvous``): it binds a
port of ``ACCUM_RENDEZVOUS_PORTS`` as it picks it (one another process holds is skipped, so
nothing can take it in between) and records that port with ``ACCUM_ADVERTISE_ADDRESS`` on the
attempt; ``place.server`` keeps it open for the attempt. None of the range free fails the job
with the reason. Torch-free at import (the store's module is imported where node 0 opens it).

Before the timeout the worker registry decides (``services.jobdb.gangs``): a gang that cannot
form with the workers free now is not opened, or released at once, so it holds no worker that
another job could use; one with ``min_nodes`` members and nobody free left to wait for starts
at once. A follower watches node 0 (``LeaderWatch``): a dead node 0's lease is ended within a
few heartbeats rather than after ACCUM_LEASE_TIMEOUT_S, so the survivors' next gang forms.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.dispatch.enqueue import enqueue_job
from services.housekeeping.reaper import end_dead_leader
from services.jobdb.gangs import (
    GangState,
    Member,
    Seat,
    gang_state,
    join_gang,
    leader_of,
    leader_silent,
    live_within,
    ports_in_use,
    record_endpoint,
    settle_gang,
)
from services.jobdb.leases import finish_job
from services.jobdb.models import Job
from services.jobdb.sessions import session_factory
from services.jobdb.status import JobStatus
from services.jobdb.types import utcnow
from services.settings import Settings, port_range

if TYPE_CHECKING:
    from services.worker.rendezvous import Server

log = logging.getLogger(__name__)

POLL_S = 0.2  # a gang's members see it complete within this
# How often a waiting member asks whether the gang should start or release before its
# timeout (``services.jobdb.gangs``: who of the queue is free, from the worker registry).
EARLY_CHECK_S = 1.0


def registry_fresh_s(settings: Settings) -> float:
    """How recently a worker's registry row must have been renewed for a gang to count it as
    live (``services.jobdb.gangs.live_within``)."""
    return live_within(settings.heartbeat_interval_s)


class GangNotFormed(RuntimeError):
    """The gang did not form within ACCUM_GANG_FORM_TIMEOUT_S; the message says why."""


@dataclass(frozen=True)
class GangPlace:
    """This worker's node in a formed gang and where its rendezvous store listens."""

    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    master_secret: str = field(repr=False)  # what its ranks present to join the store
    # Node 0: the rendezvous store it serves from this process for the attempt (closed when
    # the attempt ends here: ``close``); None on the other nodes.
    server: Server | None = field(default=None, compare=False, repr=False)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def claim_seat(
    settings: Settings, job_id: str, worker_name: str, gpu: str | None = None, ranks: int = 0,
) -> Seat | None:
    """Join the gang of the job's queue (see ``services.jobdb.gangs``: possibly another gang job
    of the queue, the one forming); None: drop the message. ``ranks``: what this worker offers a
    node (its GPUs, or ``--cpu-ranks``). The worker that starts a gang sends one message more
    per other node, so that many idle workers of the queue come to join."""
    name = worker_name or socket.gethostname()
    member = Member(name, f"{name}/{uuid.uuid4().hex[:8]}", socket.gethostname(), gpu, ranks)
    with session_factory(settings).begin() as session:
        seat = join_gang(session, job_id, member, lease_timeout_s=settings.lease_timeout_s,
                         poison_after=settings.poison_after_lost_attempts,
                         fresh_s=registry_fresh_s(settings))
    if seat is not None and seat.opened:  # after the commit: a joiner must see the gang
        for _ in range(seat.nodes - 1):
            enqueue_job(settings, seat.job_id, seat.queue)
    return seat


def wait_for_gang(
    settings: Settings, seat: Seat, sleep: Callable[[float], None] = time.sleep,
) -> GangPlace:
    """Block until ``seat``'s gang formed and node 0 recorded its endpoint; node 0 records it
    here. Every EARLY_CHECK_S, settles the gang where waiting cannot help (started on
    ``min_nodes`` members when no free worker of the queue is left to join, released when too
    few are free to complete it), and once ACCUM_GANG_FORM_TIMEOUT_S passed (started on
    ``min_nodes`` or more, or released). Raises ``GangNotFormed`` with the reason when it was
    released, or when node 0 records no endpoint within the lease timeout after the gang
    formed."""
    sessions = session_factory(settings)
    limit = settings.gang_form_timeout_s + settings.lease_timeout_s
    started = time.monotonic()
    deadline = started + limit
    next_check = started + EARLY_CHECK_S
    while True:
        with sessions.begin() as session:
            state = gang_state(session, seat)
            # Settling writes (it locks the queue's gang): once a check is due. The member
            # that started the gang joined first, so it settles it on time.
            due = time.monotonic() >= next_check
            if due and not (state.formed or state.released):
                next_check = time.monotonic() + EARLY_CHECK_S
                settle_gang(session, seat.queue, form_timeout_s=settings.gang_form_timeout_s,
                            lease_timeout_s=settings.lease_timeout_s,
                            poison_after=settings.poison_after_lost_attempts,
                            fresh_s=registry_fresh_s(settings))
                state = gang_state(session, seat)
        if state.released:
            raise GangNotFormed(state.reason)
        if state.formed and seat.node_rank == 0 and state.master_port is None:
            return _open_endpoint(settings, seat, state)
        if state.formed and state.master_addr and state.master_port is not None:
            place = GangPlace(seat.node_rank, state.nnodes, state.master_addr, state.master_port,
                              state.master_secret)
            LeaderWatch(settings, seat, place).start()
            return place
        if state.formed and not attempt_open(sessions, seat.job_id, seat.attempt):
            raise GangNotFormed(
                f"job {seat.job_id}: attempt {seat.attempt} ended before node 0 opened its "
                "rendezvous (the job's error says why)"
            )
        if time.monotonic() > deadline:
            raise GangNotFormed(
                f"job {seat.job_id}: node 0 recorded no rendezvous endpoint within {limit:g} s "
                "of joining (ACCUM_GANG_FORM_TIMEOUT_S + ACCUM_LEASE_TIMEOUT_S): its worker is "
                "gone; the reaper re-queues the job when its lease expires"
            )
        sleep(POLL_S)


class LeaderWatch:
    """A follower's watch on node 0 for the attempt, in a daemon thread of its worker: when
    node 0's worker dies (kill -9, its host gone), its lease would keep the job for
    ACCUM_LEASE_TIMEOUT_S before the reaper re-queued it. Every heartbeat interval, until the
    attempt ends, it checks whether node 0 is gone: its lease and its worker's registry row
    both unrenewed for ``registry_fresh_s`` (three beats: two threads of that process silent),
    and its rendezvous store refusing connections (the store lives in node 0's worker process;
    a store that accepts, or does not answer, keeps the lease: a frozen process, a network
    cut). Then it expires the lease now (``leader_lost`` event) and re-queues the job as the
    reaper would (``services.housekeeping.reaper.end_dead_leader``), so the survivors' next
    gang forms within seconds. A prefork child's watch ends with its job: its worker's reaper
    makes the same check every ACCUM_REAPER_INTERVAL_S (``end_dead_leaders_once``)."""

    def __init__(self, settings: Settings, seat: Seat, place: GangPlace) -> None:
        self.settings, self.seat, self.place = settings, seat, place
        self._thread = threading.Thread(target=self._run, name=f"accum-leader-watch-{seat.job_id}",
                                        daemon=True)

    def start(self) -> LeaderWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            time.sleep(self.settings.heartbeat_interval_s)
            try:
                if self.check() is not None:
                    return
            except Exception:  # a database blip: look again next beat
                log.debug("job %s: leader watch failed", self.seat.job_id, exc_info=True)

    def check(self) -> bool | None:
        """One look: True (the lease was ended and the job re-queued), False (the attempt ended
        otherwise), None (node 0 lives, or cannot be told dead: look again)."""
        settings, seat = self.settings, self.seat
        with session_factory(settings)() as session:
            leader = leader_of(session, seat.job_id, seat.attempt)
        if not leader.running:
            return False
        if not leader_silent(leader, now=utcnow(), fresh_s=registry_fresh_s(settings),
                             lease_timeout_s=settings.lease_timeout_s):
            return None
        ended = end_dead_leader(settings, seat.job_id, seat.attempt, leader, self.place.master_addr,
                                self.place.master_port, by=f"node {seat.node_rank}")
        return True if ended else None


def attempt_open(sessions: sessionmaker[Session], job_id: str, attempt: int) -> bool:
    """Whether the job still runs ``attempt`` (node 0 may have ended it)."""
    with sessions() as session:
        row = session.execute(select(Job.status, Job.attempts).where(Job.id == job_id)).one_or_none()
    return row is not None and row.status == JobStatus.RUNNING and row.attempts == attempt


def _open_endpoint(settings: Settings, seat: Seat, state: GangState) -> GangPlace:
    """Node 0: serve the gang's rendezvous store on a port of the range and record that port.
    None of the range free fails the job (the reason, ACCUM_RENDEZVOUS_PORTS and how to widen
    it, is its error) and raises ``GangNotFormed``: the followers see the job end."""
    from services.worker.rendezvous import PortsTaken  # lazy: this module stays torch-free

    address = settings.advertise_address
    sessions = session_factory(settings)
    try:
        with sessions.begin() as session:
            server = open_rendezvous(settings.rendezvous_ports, ports_in_use(session, address),
                                     address=address, timeout_s=settings.collective_timeout_s)
            try:
                record_endpoint(session, seat.job_id, seat.attempt, address, server.port, server.secret)
            except BaseException:
                server.close()
                raise
    except PortsTaken as exc:
        with sessions.begin() as session:
            finish_job(session, seat.job_id, seat.worker_id, JobStatus.FAILED,
                       error={"type": "RendezvousPortsTaken", "message": str(exc)})
        raise GangNotFormed(f"job {seat.job_id}: {exc}") from exc
    log.info("job %s: gang of %d nodes formed; rendezvous at %s:%d", seat.job_id,
             state.nnodes, address, server.port)
    return GangPlace(seat.node_rank, state.nnodes, address, server.port, server.secret, server)


def open_rendezvous(ports: str, taken: set[int], *, address: str, timeout_s: float,
                    rng: random.Random | None = None) -> Server:
    """Node 0's rendezvous store, served from this process on a port of the range ``ports``
    (ACCUM_RENDEZVOUS_PORTS) that no open attempt recorded on this address, bound as it is
    picked (``services.worker.rendezvous``), on ``address`` only (ACCUM_ADVERTISE_ADDRESS): a
    port another process holds is skipped. From a random start, so two leaders on one host
    rarely try the same port first."""
    from services.worker.rendezvous import open_server  # lazy: this module stays torch-free

    candidates = [port for port in port_range(ports) if port not in taken]
    start = (rng or random).randrange(len(candidates)) if candidates else 0
    return open_server(
        candidates[start:] + candidates[:start], address=address, timeout_s=timeout_s,
        what=f"ACCUM_RENDEZVOUS_PORTS {ports!r} on this node, {len(taken)} of them recorded by "
             "running gangs; widen the range (e.g. 29500-29599), and open it between the nodes",
    )
