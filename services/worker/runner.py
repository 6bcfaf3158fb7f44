"""Run one attempt of a job: claim it, build it from its spec, train, record the outcome.

    run_job(settings, job_id, worker_name="accum@host")   # what the Celery task calls -> Outcome

The database decides who trains: the claim is one atomic UPDATE, and a message whose claim
fails (job cancelled, finished, or held by a live worker) is simply dropped. Failures are
final (a bad spec, a missing dataset, an exception in training fail the job with the error
and its traceback as an event): retrying them would fail the same way. Lost workers are the
lease reaper's business, not Celery's. A worker shutting down (SIGTERM) stops the job, which
is checkpointed where it stopped, and hands it back to the queue (``services.worker.shutdown``).
"""

from __future__ import annotations

import logging
import socket
import time
import traceback
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from accumcore import NonFiniteError
from services.artifacts import ArtifactStoreError
from services.dispatch.enqueue import enqueue_job
from services.jobdb.attempts import record_phases
from services.jobdb.events import add_event
from services.jobdb.leases import (
    NODE_LOST,
    STORE_FAULT,
    Fault,
    claim_job,
    finish_job,
    hand_back_job,
    renew_lease,
    requeue_after_fault,
)
from services.jobdb.models import Job
from services.jobdb.nonfinite import label
from services.jobdb.queue_order import held_by_running_cap, next_in_line
from services.jobdb.sessions import session_factory
from services.jobdb.status import JobStatus
from services.jobdb.types import utcnow
from services.jobdb.workers import queue_offers
from services.settings import Settings
from services.spec import JobSpec, parse_spec
from services.spec.job import stored
from services.spec.priority import priority_number
from services.spec.world import enough_ranks
from services.worker import phases, shutdown
from services.worker.attempt import Attempt, NodeLost, Outcome
from services.worker.datasets import named_as_synced
from services.worker.gang import GangPlace
from services.worker.gang_node import follow, is_multi_node, join
from services.worker.heartbeat import Heartbeat
from services.worker.launch import launch
from services.worker.node_start import attempt_of, ready
from services.worker.offer import describe_gpu, ranks_here
from services.worker.output_capture import captured_output
from services.worker.retry import retry_while_unreachable
from services.worker.trackers.job import end_runs

log = logging.getLogger(__name__)

TRACEBACK_LIMIT = 20_000  # characters kept in the traceback event
# The first back-off after a store fault; doubled per restart, capped at half a lease timeout
# (the worker holds the lease meanwhile, so nobody else claims the job and fails the same way).
FAULT_BACKOFF_S = 2.0


def left_to_a_bigger_worker(session: Session, job_id: str, settings: Settings) -> bool:
    """A ``gpus: k`` job with more ranks than this worker offers, which a worker of its queue
    registered (the fleet the submit check reads: seen within ``ACCUM_QUEUE_GRACE_S``, a
    stopped one too): not claimed here, it waits for that worker (the reaper sends its message
    again). Failed only where the API would refuse it now: ``train`` fails it with the fix."""
    row = session.execute(select(Job.spec, Job.queue).where(Job.id == job_id)).one_or_none()
    gpus = int(stored(row.spec, "gpus")) if row is not None else 0
    if row is None or enough_ranks(gpus, 0) or enough_ranks(gpus, ranks_here(settings)):  # NVML read for DDP jobs only
        return False
    fleet = queue_offers(session, utcnow() - timedelta(seconds=settings.queue_grace_s))
    offer = fleet.get(row.queue)
    return offer is not None and enough_ranks(gpus, offer.max_ranks)


def claim(settings: Settings, job_id: str, worker_name: str) -> Attempt | None:
    """Claim the job atomically; None means: drop the message."""
    # Unique per attempt: a heartbeat left over from an earlier attempt in this process can
    # never renew (or finish) the lease of this one.
    worker_id = f"{worker_name or socket.gethostname()}/{uuid.uuid4().hex[:8]}"
    with session_factory(settings).begin() as session:
        if held_by_running_cap(session, job_id, settings.max_running_jobs_per_owner):
            log.info("job %s waits: its owner runs ACCUM_MAX_RUNNING_JOBS_PER_OWNER jobs on its "
                     "queue already", job_id)
            return None
        if left_to_a_bigger_worker(session, job_id, settings):
            log.info("job %s asks for more ranks than this worker offers: left to a bigger "
                     "worker of its queue", job_id)
            return None
        job = claim_job(
            session, job_id, worker_id, socket.gethostname(), describe_gpu(),
            settings.lease_timeout_s, worker_name=worker_name or None,
            poison_after=settings.poison_after_lost_attempts,
        )
        if job is None:
            return None
        return attempt_of(session, job, worker_id)


def run_job(settings: Settings, job_id: str, worker_name: str = "") -> Outcome:
    """Run the job if it can be claimed. Returns the status recorded (``SUCCEEDED``,
    ``FAILED``, ``CANCELLED``), ``HANDED_BACK`` (the worker is shutting down: the job is queued
    again), ``SKIPPED`` (not claimable: the message is dropped) or ``LEASE_LOST`` (someone
    else owns the job now)."""
    gang: GangPlace | None = None
    phases.begin()
    if is_multi_node(settings, job_id):
        joined = join(settings, job_id, worker_name, describe_gpu(), ranks_here(settings))
        if joined is not None and joined.place.node_rank > 0:
            return follow(settings, joined)
        attempt, gang = (joined.attempt, joined.place) if joined is not None else (None, None)
    else:
        attempt = claim(settings, job_id, worker_name)
    if attempt is None:
        log.info("job %s is not claimable (cancelled, finished or running elsewhere): skipped", job_id)
        return Outcome.SKIPPED
    phases.mark("claim")
    sessions = session_factory(settings)
    heartbeat = Heartbeat(
        lambda: _renew(sessions, attempt, settings.lease_timeout_s),
        settings.heartbeat_interval_s,
        settings.lease_timeout_s,
        shutdown=shutdown.requested,
    )
    error: dict[str, Any] | None = None
    fault: tuple[str, Fault] | None = None  # a restart counted: why, and which fault
    with heartbeat:
        try:
            spec = parse_spec(attempt.spec)
            # A spec stored before timeouts existed runs under the service's maximum.
            timeout_s = int(spec.timeout or settings.max_job_seconds)
            # The timeout is the job's run time over its attempts: this one gets what is left
            # (none left: it stops at its first beat, checkpointed at its first window).
            heartbeat.set_timeout(max(timeout_s - attempt.used_s, 0.0))
            with captured_output(settings, job_id, attempt.attempt):  # `accum logs`
                outcome = train(settings, spec, attempt, heartbeat, gang)
            if outcome == Outcome.TIMED_OUT:
                outcome, error = Outcome.FAILED, timeout_error(attempt, timeout_s)
        except NodeLost as exc:
            # Resumed from its last checkpoint on the nodes left: a restart, counted, so a job
            # that keeps losing nodes (or hanging: exc.fault, leases.HUNG) ends failed once
            # max_restarts is reached.
            outcome, fault = Outcome.HANDED_BACK, (
                f"{exc}; every rank stopped, and the job resumes from its last checkpoint on the "
                "workers that can take it (at least min_nodes)", exc.fault or NODE_LOST)
            log.warning("job %s: %s", job_id, exc)
        except ArtifactStoreError as exc:
            outcome, fault = Outcome.HANDED_BACK, (f"checkpoint store {settings.artifacts_url}: {exc}", STORE_FAULT)
            log.warning("job %s: artifact store fault: %s", job_id, exc)
            back_off(heartbeat, FAULT_BACKOFF_S * 2 ** min(attempt.attempt - 1, 5),
                     settings.lease_timeout_s / 2)
        except Exception as exc:
            outcome, error = Outcome.FAILED, error_of(exc)
            error["message"] = named_as_synced(settings, error["message"])
            log.exception("job %s failed", job_id)
            if not heartbeat.lease_lost:
                with sessions.begin() as session:
                    add_event(session, job_id, "traceback", f"{error['type']}: {error['message']}",
                              {"traceback": named_as_synced(settings, traceback.format_exc()[-TRACEBACK_LIMIT:])},
                              attempt=attempt.attempt)
    if gang is not None:
        gang.close()  # node 0's rendezvous store: every rank of the attempt is gone
    if heartbeat.lease_lost or outcome == Outcome.LEASE_LOST:
        log.error("job %s: lease lost; leaving the job to its new owner", job_id)
        return Outcome.LEASE_LOST
    if fault is not None:
        return _after_fault(settings, sessions, attempt, *fault)
    if outcome == Outcome.HANDED_BACK:
        queue = retry_while_unreachable(lambda: _hand_back(sessions, attempt),
                                        what=f"job {job_id}: handing back", for_s=settings.lease_timeout_s)
        if queue is not None:
            # after the commit, as the reaper does
            enqueue_job(settings, job_id, queue, priority_number(stored(attempt.spec, "priority")))
            log.warning("job %s handed back to queue %s: it resumes from its last checkpoint", job_id, queue)
            return Outcome.HANDED_BACK
        outcome = Outcome.CANCELLED  # a cancel came first (or the lease is gone: finishing fails too)
    final = outcome
    # The outcome survives a database outage at the very end (retried for a lease timeout).
    if not retry_while_unreachable(
        lambda: _finish(sessions, attempt, final, error),
        what=f"job {job_id}: recording {final}", for_s=settings.lease_timeout_s,
    ):
        log.error("job %s: lease lost before recording %s", job_id, final)
        return Outcome.LEASE_LOST
    if settings.max_running_jobs_per_owner:
        nudge_next_in_line(settings, job_id)
    return final


def nudge_next_in_line(settings: Settings, job_id: str) -> None:
    """The owner's next queued job on this queue may start now that this one ended (a worker
    may have dropped its message while the running cap held it)."""
    try:
        with session_factory(settings)() as session:
            following = next_in_line(session, job_id)
        if following is not None:
            enqueue_job(settings, *following)
    except Exception:  # the reaper's lost-message rescue sends it later
        log.warning("job %s: could not nudge its owner's next job", job_id, exc_info=True)


def timeout_error(attempt: Attempt, timeout_s: int) -> dict[str, Any]:
    # A multi-GPU job's ranks stop together and checkpoint too (services.worker.distributed);
    # only ranks stuck past the lease timeout are terminated, keeping the latest checkpoint.
    return {
        "type": "JobTimeout",
        "reason": "timeout",
        "message": (
            f"the job ran for its timeout of {timeout_s} s (spec timeout, counted over its "
            "attempts since submit or the last resume; at most ACCUM_MAX_JOB_SECONDS) and was "
            "stopped and checkpointed at its last finished window; "
            f"`accum resume {attempt.job_id}` continues from there for another timeout "
            "(`--timeout 2h` sets a new one)"
        ),
    }


def back_off(heartbeat: Heartbeat, delay_s: float, cap_s: float) -> None:
    """Wait before handing a faulted attempt back, holding the lease; a cancel, a shutdown or
    a lost lease ends the wait."""
    deadline = time.monotonic() + min(delay_s, cap_s)
    while time.monotonic() < deadline and not heartbeat.should_stop():
        time.sleep(0.05)


def _after_fault(settings: Settings, sessions: sessionmaker[Session], attempt: Attempt,
                 reason: str, fault: Fault) -> Outcome:
    """Back to the queue with a restart counted (``HANDED_BACK``), ``FAILED`` when no
    restarts are left, ``CANCELLED`` when a cancel came first; ``LEASE_LOST`` when the lease
    is gone."""

    def requeue() -> tuple[str, str] | None:
        with sessions.begin() as session:
            return requeue_after_fault(session, attempt.job_id, attempt.worker_id, reason, fault=fault)

    moved = retry_while_unreachable(requeue, what=f"job {attempt.job_id}: handing back after "
                                    f"{fault.after}", for_s=settings.lease_timeout_s)
    if moved is None:
        # A cancel came first: finished as cancelled while the lease is held (its attempt too),
        # else the lease is gone and the job is its new owner's.
        cancelled = retry_while_unreachable(
            lambda: _finish(sessions, attempt, Outcome.CANCELLED, None),
            what=f"job {attempt.job_id}: recording cancelled", for_s=settings.lease_timeout_s)
        return Outcome.CANCELLED if cancelled else Outcome.LEASE_LOST
    if moved[0] == JobStatus.QUEUED:
        enqueue_job(settings, attempt.job_id, moved[1], priority_number(stored(attempt.spec, "priority")))
        return Outcome.HANDED_BACK
    # No restart left: the job ends here, and its tracker runs with it (a rank that died or
    # hung may have left them open; the next attempt would have continued them).
    try:
        end_runs(settings, sessions, attempt, "failed")
    except Exception:  # the job's outcome is recorded; its runs stay as they were
        log.warning("job %s: could not end its tracker runs", attempt.job_id, exc_info=True)
    return Outcome.FAILED


def _finish(sessions: sessionmaker[Session], attempt: Attempt, outcome: Outcome,
            error: dict[str, Any] | None) -> bool:
    with sessions.begin() as session:
        finished = finish_job(session, attempt.job_id, attempt.worker_id, JobStatus(outcome), error=error)
        if finished:  # in the outcome's transaction: no round trip of its own
            phases.mark("finish")
            record_phases(session, attempt.job_id, attempt.attempt, phases.taken())
        return finished


def _hand_back(sessions: sessionmaker[Session], attempt: Attempt) -> str | None:
    with sessions.begin() as session:
        return hand_back_job(session, attempt.job_id, attempt.worker_id)


def _renew(sessions: sessionmaker[Session], attempt: Attempt, lease_timeout_s: float) -> str | None:
    with sessions.begin() as session:
        return renew_lease(session, attempt.job_id, attempt.worker_id, lease_timeout_s)


def train(settings: Settings, spec: JobSpec, attempt: Attempt, heartbeat: Heartbeat,
          gang: GangPlace | None = None) -> Outcome:
    """Train on this process (or on ``spec.gpus`` DDP processes; node 0's of a ``gang``);
    returns ``SUCCEEDED``, ``CANCELLED``, ``HANDED_BACK``, ``TIMED_OUT`` or ``LEASE_LOST``."""
    spec, attempt = ready(settings, spec, attempt)  # every node's checks, its s3 copy
    phases.mark("admit")
    outcome = launch(settings, spec, attempt, heartbeat, gang)
    phases.mark("train")  # ranks in processes of their own (gpus: k, nodes): build to their end
    return outcome


def error_of(exc: Exception) -> dict[str, Any]:
    """The job's `error` for what a training attempt raised; a non-finite stop also says where
    and on what (`nonfinite`), so the job shows the NaN that stopped it, not the last finite
    value before it."""
    error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc) or repr(exc)}
    if isinstance(exc, NonFiniteError):
        error["nonfinite"] = {"step": exc.step, "metric": exc.metric, "value": label(exc.value) or "NaN"}
    return error
