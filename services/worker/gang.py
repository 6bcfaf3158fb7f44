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
"""

from __future__ import annotations

import logging
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.dispatch.enqueue import enqueue_job
from services.jobdb.gangs import (
    GangState,
    Member,
    Seat,
    gang_state,
    join_gang,
    ports_in_use,
    record_endpoint,
    settle_gang,
)
from services.jobdb.leases import finish_job
from services.jobdb.models import Job
from services.jobdb.sessions import session_factory
from services.jobdb.status import JobStatus
from services.settings import Settings, port_range

if TYPE_CHECKING:
    from services.worker.rendezvous import Server

log = logging.getLogger(__name__)

POLL_S = 0.2  # a gang's members see it complete within this


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
                         poison_after=settings.poison_after_lost_attempts)
    if seat is not None and seat.opened:  # after the commit: a joiner must see the gang
        for _ in range(seat.nodes - 1):
            enqueue_job(settings, seat.job_id, seat.queue)
    return seat


def wait_for_gang(
    settings: Settings, seat: Seat, sleep: Callable[[float], None] = time.sleep,
) -> GangPlace:
    """Block until ``seat``'s gang formed and node 0 recorded its endpoint; node 0 records it
    here. Settles the gang once ACCUM_GANG_FORM_TIMEOUT_S passed (started on ``min_nodes`` or
    more, or released). Raises ``GangNotFormed`` with the reason when it was released, or
    when node 0 records no endpoint within the lease timeout after the gang formed."""
    sessions = session_factory(settings)
    limit = settings.gang_form_timeout_s + settings.lease_timeout_s
    started = time.monotonic()
    deadline = started + limit
    while True:
        with sessions.begin() as session:
            state = gang_state(session, seat)
            # Settling writes (it locks the queue's gang): only once it can be due. The member
            # that started the gang joined first, so it settles it on time.
            due = time.monotonic() - started >= settings.gang_form_timeout_s
            if due and not (state.formed or state.released):
                settle_gang(session, seat.queue, form_timeout_s=settings.gang_form_timeout_s,
                            lease_timeout_s=settings.lease_timeout_s,
                            poison_after=settings.poison_after_lost_attempts)
        if state.released:
            raise GangNotFormed(state.reason)
        if state.formed and seat.node_rank == 0 and state.master_port is None:
            return _open_endpoint(settings, seat, state)
        if state.formed and state.master_addr and state.master_port is not None:
            return GangPlace(seat.node_rank, state.nnodes, state.master_addr, state.master_port,
                             state.master_secret)
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
