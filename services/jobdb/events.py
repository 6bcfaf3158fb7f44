"""Job events: the lifecycle log (kinds in docs/architecture.md).

State transitions in ``jobs`` and ``leases`` write their own events in the same transaction
(``created``, ``started``, ``cancel_requested``, ``cancelled``, ``succeeded``, ``failed``,
``resumed``, ``lease_expired``, ``requeued``); the worker adds the rest (``traceback``,
``checkpoint``, ``oom_backoff``, ...) with ``add_event``. Functions here flush, never commit.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from services.jobdb.models import JobEvent


def add_event(
    session: Session,
    job_id: str,
    kind: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    attempt: int = 0,
) -> JobEvent:
    """Append one event; returns it with ``id`` and ``created_at`` set. Does not commit."""
    event = JobEvent(job_id=job_id, kind=kind, message=message, data=data or {}, attempt=attempt)
    session.add(event)
    session.flush()
    return event


def list_events(
    session: Session, job_id: str, after_id: int | None = None, limit: int = 100
) -> list[JobEvent]:
    """Events of a job in order, oldest first, with ``id > after_id`` (for polling/SSE)."""
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    query = select(JobEvent).where(JobEvent.job_id == job_id)
    if after_id is not None:
        query = query.where(JobEvent.id > after_id)
    return list(session.scalars(query.order_by(JobEvent.id).limit(limit)))


def latest_event(session: Session, job_id: str, kind: str) -> JobEvent | None:
    """The job's newest event of ``kind`` (e.g. the attempt's ``exactness_check``), or None."""
    query = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == kind)
    return session.scalars(query.order_by(JobEvent.id.desc()).limit(1)).first()


TRANSITION_KINDS = (
    "created", "started", "cancel_requested", "cancelled", "succeeded", "failed", "resumed",
    "requeued", "lease_expired",
)


def failure_reason(error: dict[str, Any] | None) -> str:
    """A failed job's cause as a short label: the service's own reason (timeout, poison), a
    lost worker past max_restarts, a diverged run, or any other error."""
    error = error or {}
    if error.get("reason"):
        return str(error["reason"])
    return {"LeaseExpired": "lease_expired", "NonFiniteError": "nonfinite"}.get(
        str(error.get("type")), "error"
    )


_SIGNAL_NAME = re.compile(r"\((SIG[A-Z0-9]+)\)")


def death_label(cause: str) -> str:
    """A bounded label for why an attempt's process died (``process_died``'s cause, written by
    services/worker/process_death.py): ``oom_killer``, the signal's name (``SIGKILL``,
    ``SIGSEGV``, ...), ``exit_code``, or ``other``."""
    if cause.startswith("out of memory"):
        return "oom_killer"
    signal = _SIGNAL_NAME.search(cause)
    if signal:
        return signal.group(1)
    return "exit_code" if cause.startswith("exited with code") else "other"


# Why a job was queued again (a ``requeued`` event's ``reason``; none: the reaper found its
# lease expired).
RESTART_CAUSES = ("lease_expired", "worker_shutdown", "node_lost", "hung", "store_fault")


def lifecycle_counts(session: Session) -> dict[str, dict[str, int]]:
    """Totals for Prometheus counters, read from the event log (every process writes it, so it
    counts what workers and reapers did too): events by kind, restarts by cause
    (``RESTART_CAUSES``), lease expiries by whether the lost attempt had
    written a checkpoint, failures by ``failure_reason``, attempts' process deaths by
    ``death_label``."""
    by_kind = dict.fromkeys(TRANSITION_KINDS, 0)
    for kind, count in session.execute(
        select(JobEvent.kind, func.count())
        .where(JobEvent.kind.in_(TRANSITION_KINDS))
        .group_by(JobEvent.kind)
    ):
        by_kind[kind] = count
    # A requeue's cause by its own name: node_lost, hung and store_fault restarts are no lease expiry.
    restarts = dict.fromkeys(RESTART_CAUSES, 0)
    expiries = {"no_progress": 0, "after_checkpoint": 0}
    failures: dict[str, int] = {}
    deaths: dict[str, int] = {}
    rows = session.execute(
        select(JobEvent.kind, JobEvent.data).where(
            JobEvent.kind.in_(("requeued", "lease_expired", "failed", "process_died"))
        )
    )
    for kind, data in rows:
        data = data or {}
        if kind == "process_died":
            label = death_label(str(data.get("cause", "")))
            deaths[label] = deaths.get(label, 0) + 1
        elif kind == "requeued":
            cause = str(data.get("reason") or "lease_expired")
            restarts[cause] = restarts.get(cause, 0) + 1
        elif kind == "lease_expired":
            expiries["no_progress" if data.get("no_progress") else "after_checkpoint"] += 1
        else:
            reason = failure_reason(data.get("error"))
            failures[reason] = failures.get(reason, 0) + 1
    return {"transitions": by_kind, "restarts": restarts, "lease_expiries": expiries,
            "failures": failures, "process_deaths": deaths}
