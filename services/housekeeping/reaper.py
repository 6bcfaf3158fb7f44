"""The lease reaper: re-queues jobs whose worker stopped renewing its lease, and re-sends
the broker message of queued jobs whose message may be lost.

It runs as a thread in every worker and in the API process, so a job whose worker died
(kill -9, lost node) is recovered as long as any accum process is up. Reaping is one atomic
UPDATE per job in the store (``reap_expired_leases``), so several reapers at once are safe;
each re-queued job gets a fresh broker message (the old one died with its worker).
A job still ``queued`` whose last message is older than ``ACCUM_REQUEUE_AFTER_S``
(``stale_queued_jobs``: the broker was down when the API submitted it, or a worker died
between taking its message and claiming it) is enqueued again, at most once per period; a job
whose publish failed (marked unsent: ``enqueued_at`` NULL) on the next pass, in submit order.
Sooner where waiting cannot explain it: a queued job beside an idle worker of its queue, with
no message of its own in the broker, is sent again once its last is ``ACCUM_IDLE_REQUEUE_AFTER_S``
old (the broker lost its memory: ``resend_for_idle_workers_once``).

    reaper = LeaseReaper(settings).start()
    ...
    reaper.stop()

A ``--pool prefork`` worker forks its pool's children from the process this thread runs in.
A fork taken mid-pass copied the locks the pass held (the session-factory cache's, and as
well SQLAlchemy's, psycopg's, redis-py's) into the child, locked for good there: the child
hung on its first database call and never claimed its job. So a fork waits for the pass in
progress to end (``os.register_at_fork``), and the next pass waits for the fork.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.dispatch.broker import DEFAULT_QUEUE
from services.dispatch.broker_messages import jobs_in_broker
from services.dispatch.unsent import resend_stale_once, send_in_order
from services.housekeeping.retention import sweep_retention
from services.jobdb.gangs import (
    Leader,
    end_lost_leader_lease,
    formable_jobs,
    live_within,
    settle_stale_gangs,
    silent_leaders,
)
from services.jobdb.leases import (
    reap_expired_leases,
    stale_queued_ids,
    stale_queued_jobs,
)
from services.jobdb.models import Job
from services.jobdb.queue_order import held_jobs
from services.jobdb.sessions import session_factory
from services.jobdb.types import utcnow
from services.jobdb.workers import idle_workers
from services.settings import Settings

log = logging.getLogger(__name__)

# A pass is a few queries and sends, each bounded by a connect or socket timeout; past this a
# fork goes ahead rather than block the worker (and the child may hang, as before the guard).
FORK_WAIT_S = 30.0


# While a send fails (the broker is down), the reaper's passes come this often (seconds), so
# the jobs waiting for it are sent within this long of the broker's return.
UNSENT_RETRY_S = 2.0

# Seconds since the epoch, as time.time; tests pass one that runs ahead instead of sleeping.
Clock = Callable[[], float]


def _now(clock: Clock) -> datetime:
    return datetime.fromtimestamp(clock(), UTC)


def queue_of(session: Session, job_id: str) -> str:
    return str(session.scalar(select(Job.queue).where(Job.id == job_id)) or DEFAULT_QUEUE)


def reap_once(
    settings: Settings, clock: Clock = time.time, queues: Collection[str] | None = None
) -> list[str]:
    """Re-queue (or fail, past ``max_restarts``) every job (on ``queues``, when given) whose
    lease expired before ``clock()``; returns the ids of the jobs re-queued and enqueued again."""
    with session_factory(settings).begin() as session:
        requeued_ids, _failed = reap_expired_leases(
            session, now=_now(clock), poison_after=settings.poison_after_lost_attempts,
            queues=queues,
        )
        requeued = [(job_id, queue_of(session, job_id)) for job_id in requeued_ids]
    # Enqueue after the commit: a worker that takes the message must see the job queued.
    send_in_order(settings, requeued, "job %s lost its worker; re-queued on %s")
    return [job_id for job_id, _ in requeued]


def resend_for_idle_workers_once(
    settings: Settings, clock: Clock = time.time, queues: Collection[str] | None = None
) -> list[str]:
    """The database is the truth for the queue: on each queue (of ``queues``) with an idle
    worker, enqueue again, in submit order, the queued jobs whose last message is older than
    ``ACCUM_IDLE_REQUEUE_AFTER_S`` and of which the broker holds no message (``jobs_in_broker``:
    none waiting, none taken by a worker), as after Redis restarted without persistence;
    returns their ids. Not a job the running cap holds (the claim would drop it), nor on a
    broker that cannot be read so (the embedded one keeps its queues on disk):
    ``resend_stale_once`` after ``ACCUM_REQUEUE_AFTER_S`` is the rescue there."""
    now = _now(clock)
    older_than = now - timedelta(seconds=float(settings.idle_requeue_after_s))
    with session_factory(settings).begin() as session:
        idle = [queue for queue in idle_workers(session, settings.lease_timeout_s, now)
                if queues is None or queue in queues]
        waiting = stale_queued_ids(session, older_than, idle) if idle else []
        held = held_jobs(session, [job_id for job_id, _ in waiting], settings.max_running_jobs_per_owner)
    lost: list[str] = []
    for queue in sorted({queue for _, queue in waiting}):
        present = jobs_in_broker(settings, queue)
        if present is not None:
            lost += [job_id for job_id, of in waiting
                     if of == queue and job_id not in present and job_id not in held]
    if not lost:
        return []
    with session_factory(settings).begin() as session:  # unless another reaper sent it meanwhile
        resent = stale_queued_jobs(session, older_than=older_than, now=now, among=lost)
    send_in_order(settings, resent, "job %s sat queued beside an idle worker and the broker had "
                  "no message for it; enqueued again on %s")
    return [job_id for job_id, _ in resent]


def settle_gangs_once(
    settings: Settings, clock: Clock = time.time, queues: Collection[str] | None = None
) -> dict[str, str]:
    """Settle each gang (on ``queues``) still forming ``ACCUM_GANG_FORM_TIMEOUT_S`` after it
    started, when none of its members did (they died): started on ``min_nodes`` or more, else
    released (``services.jobdb.gangs``). Returns ``{queue: "formed" | "released"}``."""
    with session_factory(settings).begin() as session:
        return settle_stale_gangs(
            session, form_timeout_s=settings.gang_form_timeout_s,
            lease_timeout_s=settings.lease_timeout_s, now=_now(clock),
            poison_after=settings.poison_after_lost_attempts, queues=queues,
        )


def resend_formable_once(
    settings: Settings, clock: Clock = time.time, queues: Collection[str] | None = None
) -> list[str]:
    """Send again the message of each queued gang job (on ``queues``) that can form now: at
    least ``min_nodes`` workers of its queue are free together (``services.jobdb.gangs``'s
    ``free_workers``; a gang job that could not form holds no worker, so nothing else brings it
    back when they free up), once its last message is ``ACCUM_IDLE_REQUEUE_AFTER_S`` old."""
    now = _now(clock)
    older_than = now - timedelta(seconds=float(settings.idle_requeue_after_s))
    with session_factory(settings).begin() as session:
        ready = formable_jobs(session, queues, older_than=older_than, now=now,
                              fresh_s=live_within(settings.heartbeat_interval_s))
        resent = stale_queued_jobs(session, older_than=older_than, now=now, among=ready) if ready else []
    send_in_order(settings, resent, "gang job %s can form now (min_nodes workers of its queue "
                  "are free); enqueued again on %s")
    return [job_id for job_id, _ in resent]


def store_answers(addr: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts connections at a gang's rendezvous endpoint (node 0's worker
    process serves it); a refusal is the only no (a timeout or another error may be the
    network, not a dead process)."""
    try:
        with socket.create_connection((addr, port), timeout=timeout_s):
            return True
    except ConnectionRefusedError:
        return False
    except OSError:
        return True


def end_dead_leader(settings: Settings, job_id: str, attempt: int, leader: Leader, addr: str,
                    port: int, by: str) -> bool:
    """Node 0 of the job's ``attempt`` is silent (``services.jobdb.gangs.leader_silent``): if its
    rendezvous store at ``addr:port`` refuses connections too, its worker process is gone, so
    end its lease now (event ``leader_lost``, unless it renewed meanwhile) and re-queue the job
    as for an expired lease, rather than wait ACCUM_LEASE_TIMEOUT_S. True when it did."""
    if store_answers(addr, port):
        return False
    fresh_s = live_within(settings.heartbeat_interval_s)
    message = (
        f"node 0 ({leader.worker}) is gone: its lease and its worker's registry row were not "
        f"renewed for {fresh_s:g} s and its rendezvous store at {addr}:{port} refuses "
        f"connections; {by} ended its lease now rather than after ACCUM_LEASE_TIMEOUT_S "
        f"({settings.lease_timeout_s:g} s)"
    )
    now = utcnow()
    with session_factory(settings).begin() as session:
        if not end_lost_leader_lease(session, job_id, attempt, leader, now=now, message=message):
            return False
        requeued, _ = reap_expired_leases(session, now=now, queues=[leader.queue],
                                          poison_after=settings.poison_after_lost_attempts)
    log.warning("job %s: %s", job_id, message)
    send_in_order(settings, [(job, leader.queue) for job in requeued],
                  "job %s lost its node 0; re-queued on %s")
    return True


def end_dead_leaders_once(
    settings: Settings, clock: Clock = time.time, queues: Collection[str] | None = None
) -> list[str]:
    """``end_dead_leader`` for every running gang job on ``queues`` whose node 0 is silent: the
    backstop of the followers' own watch (``services.worker.gang.LeaderWatch``, which ends with
    a prefork child's job). A worker's reaper only (its queues' gangs are its peers, their
    endpoints reachable from it); the API's (``queues`` None) leaves them to the lease."""
    if queues is None:
        return []
    with session_factory(settings)() as session:
        silent = silent_leaders(session, queues, now=_now(clock),
                                fresh_s=live_within(settings.heartbeat_interval_s),
                                lease_timeout_s=settings.lease_timeout_s)
    return [job_id for job_id, attempt, leader, addr, port in silent
            if end_dead_leader(settings, job_id, attempt, leader, addr, port, by="a worker's reaper")]


class LeaseReaper:
    """A daemon thread calling ``reap_once``, ``resend_stale_once`` and
    ``resend_for_idle_workers_once`` (and the sweeps below) every ``interval_s``
    (``ACCUM_REAPER_INTERVAL_S``), with ``clock`` as their time."""

    def __init__(
        self, settings: Settings, interval_s: float | None = None, clock: Clock = time.time,
        queues: Collection[str] | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        # A worker reaps the jobs of its own queues (its settings, e.g. the poison rule, are
        # its queues' deployment's); None (the API): every queue.
        self.queues = queues
        self.interval_s = float(interval_s or settings.reaper_interval_s)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accum-lease-reaper", daemon=True)
        # Held for a whole pass, and by a fork of this process (see the module docstring).
        self.pass_lock = threading.Lock()

    def start(self) -> LeaseReaper:
        _running.add(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        _running.discard(self)
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        wait_s = self.interval_s
        while not self._stopped.wait(wait_s):
            wait_s = self.interval_s
            with self.pass_lock:
                steps: tuple[Callable[[], object], ...] = (
                    lambda: reap_once(self.settings, self.clock, self.queues),
                    lambda: resend_stale_once(self.settings, self.clock, self.queues),
                    lambda: resend_for_idle_workers_once(self.settings, self.clock, self.queues),
                    lambda: sweep_retention(self.settings, self.clock),
                    lambda: settle_gangs_once(self.settings, self.clock, self.queues),
                    lambda: resend_formable_once(self.settings, self.clock, self.queues),
                    lambda: end_dead_leaders_once(self.settings, self.clock, self.queues),
                )
                names = ("reap", "resend", "resend_idle", "retention", "gangs", "resend_gangs",
                         "dead_leaders")
                for name, step in zip(names, steps, strict=True):
                    try:
                        step()
                    except Exception:  # keep reaping after a database or broker blip
                        if name.startswith("resend"):
                            # Jobs wait for this send (a 20 s broker cut delayed one by
                            # ACCUM_REQUEUE_AFTER_S, 300 s): try again soon, not a period later.
                            wait_s = min(self.interval_s, UNSENT_RETRY_S)
                        log.exception("reaper step %s failed; retrying in %.1fs", name, wait_s)


_running: weakref.WeakSet[LeaseReaper] = weakref.WeakSet()
_held_over_fork: list[threading.Lock] = []


def _wait_for_passes() -> None:
    for reaper in list(_running):
        if reaper.pass_lock.acquire(timeout=FORK_WAIT_S):
            _held_over_fork.append(reaper.pass_lock)
        else:
            log.warning("forking while the lease reaper is mid-pass (over %.0fs)", FORK_WAIT_S)


def _release_passes() -> None:
    while _held_over_fork:
        _held_over_fork.pop().release()


def _forget_parent_reapers() -> None:
    _release_passes()
    _running.clear()  # their threads stay in the parent; the child runs none of them


os.register_at_fork(before=_wait_for_passes, after_in_parent=_release_passes,
                    after_in_child=_forget_parent_reapers)
