"""A worker's part in a multi-node (``nodes: n``) job: join its gang, then train this node's ranks.

    joined = join(settings, job_id, worker_name)       # None: drop the message
    if joined.place.node_rank == 0:                     # holds the lease: ``run_job`` trains
        ...                                             # and records the job as for any job
    else:
        follow(settings, joined)                        # the leader's pre-flight, then its ranks

Every node spawns its ``gpus`` ranks (one process even for ``gpus: 1``) as global ranks
``node_rank * gpus + r`` of a world of ``nnodes * gpus``, at node 0's rendezvous
(``services.worker.launch``). Node 0 holds the lease, its rank 0 writes metrics and
checkpoints, and it finishes the job or hands it back when a node is lost
(``attempt.NodeLost``); the other nodes never touch the job's row (a node that refuses the
job adds a ``node_refused`` event). Every node builds its attempt and checks the spec through
the same functions (``services.worker.node_start``). Torch-free.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.jobdb.events import add_event
from services.jobdb.gangs import members_of, nodes_of
from services.jobdb.models import Job
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.spec import parse_spec
from services.spec.world import ranks_per_node
from services.worker import shutdown
from services.worker.attempt import Attempt, NodeLost, Outcome
from services.worker.datasets import named_as_synced
from services.worker.gang import GangNotFormed, GangPlace, attempt_open, claim_seat, wait_for_gang
from services.worker.launch import launch
from services.worker.node_start import attempt_of, ready

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Joined:
    """This worker's node of a formed gang, and the attempt the gang runs."""

    attempt: Attempt
    place: GangPlace


def is_multi_node(settings: Settings, job_id: str) -> bool:
    """Whether the job asks for more than one node (its message goes to the gang path)."""
    with session_factory(settings)() as session:
        spec = session.scalar(select(Job.spec).where(Job.id == job_id))
    return nodes_of(spec)[0] > 1


def join(settings: Settings, job_id: str, worker_name: str, gpu: str | None, ranks: int) -> Joined | None:
    """Take a seat in the job's gang and wait until it formed; None: drop the message (no
    seat, or the gang was released: the reason is in the job's ``gang_released`` event)."""
    seat = claim_seat(settings, job_id, worker_name, gpu, ranks)
    if seat is None:
        return None
    try:
        place = wait_for_gang(settings, seat)
    except GangNotFormed as exc:
        log.info("job %s: gang not formed: %s", seat.job_id, exc)
        return None
    with session_factory(settings).begin() as session:
        job = session.execute(select(Job).where(Job.id == seat.job_id)).scalar_one()
        attempt = attempt_of(session, job, seat.worker_id)
        if place.node_rank == 0:
            record_world(session, attempt, place)
    return Joined(attempt, place)


def record_world(session: Session, attempt: Attempt, place: GangPlace) -> None:
    """Node 0: a ``world_changed`` event when the gang has another number of nodes than the
    attempt before it (a lost node, a gang started on ``min_nodes``)."""
    spec = parse_spec(attempt.spec)
    earlier = len(members_of(session, attempt.job_id, attempt.attempt - 1)) if attempt.attempt > 1 else 0
    before = earlier or spec.nodes
    if before == place.nnodes:
        return
    per_node = ranks_per_node(spec.gpus)
    add_event(
        session, attempt.job_id, "world_changed",
        f"{before} -> {place.nnodes} nodes ({before * per_node} -> {place.nnodes * per_node} ranks); "
        "the effective batch and every window's samples stay the same: each rank runs more "
        "micro-batches per step",
        {"nodes_before": before, "nodes": place.nnodes, "world_before": before * per_node,
         "world": place.nnodes * per_node},
        attempt=attempt.attempt,
    )


def follow(settings: Settings, joined: Joined) -> Outcome:
    """A node other than 0: train this node's ranks until the attempt ends on every node.
    Records nothing on the job (node 0 does); a lost peer ends it here too, and node 0 (or
    the reaper, when node 0 is the one lost) puts the job back for its next attempt."""
    try:
        # The leader's own pre-flight, on this node's settings: its data roots, limits and ranks.
        spec, attempt = ready(settings, parse_spec(joined.attempt.spec), joined.attempt)
    except Exception as exc:
        refuse(settings, joined, exc)
        return Outcome.FOLLOWED
    try:
        launch(settings, spec, attempt, FollowerFlags(settings, attempt), joined.place)
    except NodeLost as exc:
        log.warning("job %s: node %d lost its gang: %s", attempt.job_id, joined.place.node_rank, exc)
    except Exception:
        log.exception("job %s: node %d's ranks failed (node 0 records the job's outcome)",
                      attempt.job_id, joined.place.node_rank)
    return Outcome.FOLLOWED


def refuse(settings: Settings, joined: Joined, exc: Exception) -> None:
    """This node cannot run the job (its own settings refuse it, its s3 copy failed): said on
    the job, since the leader only sees a node that never came; its ranks stop when they miss
    this node's, and the job resumes on the workers that can take it."""
    attempt, node = joined.attempt, joined.place.node_rank
    message = named_as_synced(settings, f"node {node} did not start the job's ranks: {exc}")
    log.warning("job %s: %s", attempt.job_id, message)
    with contextlib.suppress(Exception), session_factory(settings).begin() as session:  # an outage: the log has it
        add_event(session, attempt.job_id, "node_refused", message, {"node": node}, attempt=attempt.attempt)


class FollowerFlags:
    """What a node other than 0 watches in place of a heartbeat. Its ranks stop with the
    others (node 0 stops every rank at one window boundary on a cancel, a timeout or its
    shutdown; a worker shutdown here waits for the attempt to end). Once the job no longer
    runs this attempt (node 0 handed it back after a lost or hung peer, or it ended), ranks
    still here are stuck in a collective: ``lease_lost`` makes the launcher end them at once."""

    def __init__(self, settings: Settings, attempt: Attempt) -> None:
        self.settings, self.attempt = settings, attempt
        self.lease_lost = False
        self.cancel_requested = False
        self.timed_out = False
        self._next_check = time.monotonic() + settings.heartbeat_interval_s

    @property
    def shutting_down(self) -> bool:
        return shutdown.requested.is_set()

    def should_stop(self) -> bool:
        if not self.lease_lost and time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + self.settings.heartbeat_interval_s
            self.lease_lost = not attempt_running(self.settings, self.attempt)
        return self.lease_lost


def attempt_running(settings: Settings, attempt: Attempt) -> bool:
    """Whether the job still runs ``attempt`` (a database outage counts as yes: node 0 decides)."""
    try:
        return attempt_open(session_factory(settings), attempt.job_id, attempt.attempt)
    except Exception:  # an outage: keep training; node 0's lease says who owns the job
        return True
