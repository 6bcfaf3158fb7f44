"""A job whose broker message could not be sent starts soon after the broker is back, and in
submit order: ``publish_in_order(settings, job_id, queue, priority)``, the API's publish.

A failed publish marks the job unsent (``enqueued_at`` NULL, ``services.jobdb.leases``), so
the next reaper pass sends it, every ``ACCUM_REAPER_INTERVAL_S`` and every 2 s while the
broker stays down (before: one ``ACCUM_REQUEUE_AFTER_S`` later, 300 s, after jobs submitted
later). And a process that failed a publish sends the unsent jobs first at its next publish:
a job submitted just after the broker's return does not pass the ones submitted during the
outage.
"""

from __future__ import annotations

import logging
import threading

from services.dispatch.enqueue import enqueue_job
from services.housekeeping.reaper import resend_stale_once
from services.jobdb.leases import mark_unsent
from services.jobdb.sessions import session_factory
from services.settings import Settings

log = logging.getLogger(__name__)

# Set when a publish of this process failed: its next publish sends the unsent jobs first.
_backlog = threading.Event()


def publish_in_order(settings: Settings, job_id: str, queue: str, priority: int | None = None) -> bool:
    """Publish the job's message after any earlier unsent job's; False (and the job marked
    unsent, for the reaper) when the broker cannot take it. Never raises for the broker: the
    job exists already."""
    if _backlog.is_set():
        try:
            resend_stale_once(settings)
            _backlog.clear()
        except Exception:  # still down: this job waits behind the others
            log.warning("broker still unreachable; job %s waits for the reaper", job_id, exc_info=True)
            _mark(settings, job_id)
            return False
    try:
        enqueue_job(settings, job_id, queue, priority)
        return True
    except Exception:
        log.exception("could not enqueue job %s on %r; it stays queued, marked unsent for the "
                      "reaper's next pass", job_id, queue)
        _mark(settings, job_id)
        _backlog.set()
        return False


def _mark(settings: Settings, job_id: str) -> None:
    try:
        with session_factory(settings).begin() as session:
            mark_unsent(session, [job_id])
    except Exception:  # the database too: the rescue after ACCUM_REQUEUE_AFTER_S still sends it
        log.warning("could not mark job %s unsent", job_id, exc_info=True)
