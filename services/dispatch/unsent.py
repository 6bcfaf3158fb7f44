"""A job whose broker message could not be sent starts soon after the broker is back, and in
submit order: ``publish_in_order(settings, job_id, queue, priority)``, the API's publish.

A failed publish marks the job unsent (``enqueued_at`` NULL, ``services.jobdb.leases``), so
the next reaper pass sends it, every ``ACCUM_REAPER_INTERVAL_S`` and every 2 s while the
broker stays down (before: one ``ACCUM_REQUEUE_AFTER_S`` later, 300 s, after jobs submitted
later). And a process that failed a publish sends the unsent jobs first at its next publish:
a job submitted just after the broker's return does not pass the ones submitted during the
outage.

The reaper's passes send them through ``resend_stale_once`` (with the jobs whose last message is
older than ``ACCUM_REQUEUE_AFTER_S``): the publish path lives here, in ``dispatch``, and
``services.housekeeping`` calls it, never the other way round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta

from services.dispatch.enqueue import enqueue_job
from services.jobdb.leases import mark_unsent, stale_queued_jobs
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


def resend_stale_once(
    settings: Settings, clock: Callable[[], float] = time.time, queues: Collection[str] | None = None
) -> list[str]:
    """Enqueue again, in submit order, every queued job never sent (``enqueued_at`` NULL: its
    publish failed) or whose last message is older than ``settings.requeue_after_s`` at
    ``clock()``; returns their ids. A failed send (the broker still down) marks that job and
    the rest unsent again and raises: the next pass, soon, tries them in the same order."""
    now = datetime.fromtimestamp(clock(), UTC)
    older_than = now - timedelta(seconds=float(settings.requeue_after_s))
    with session_factory(settings).begin() as session:
        stale = stale_queued_jobs(session, older_than=older_than, now=now, queues=queues)
    send_in_order(settings, stale, "job %s was queued with no recent message; enqueued again on %s")
    return [job_id for job_id, _ in stale]


def send_in_order(settings: Settings, jobs: list[tuple[str, str]], logged: str) -> None:
    """Enqueue each ``(id, queue)`` in turn (``logged`` % both after each); at the first failed
    send, that job and the rest are marked unsent (the next pass sends them) and it raises."""
    for index, (job_id, queue) in enumerate(jobs):
        try:
            enqueue_job(settings, job_id, queue)
        except Exception:
            with session_factory(settings).begin() as session:
                mark_unsent(session, [unsent for unsent, _ in jobs[index:]])
            raise
        log.warning(logged, job_id, queue)


def _mark(settings: Settings, job_id: str) -> None:
    try:
        with session_factory(settings).begin() as session:
            mark_unsent(session, [job_id])
    except Exception:  # the database too: the rescue after ACCUM_REQUEUE_AFTER_S still sends it
        log.warning("could not mark job %s unsent", job_id, exc_info=True)
