"""The lease reaper: re-queues jobs whose worker stopped renewing its lease.

It runs as a thread in every worker and in the API process, so a job whose worker died
(kill -9, lost node) is recovered as long as any accum process is up. Reaping is one atomic
UPDATE per job in the store (``reap_expired_leases``), so several reapers at once are safe;
each re-queued job gets a fresh broker message (the old one died with its worker).

    reaper = LeaseReaper(settings).start()
    ...
    reaper.stop()
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.store.leases import reap_expired_leases
from services.store.models import Job
from services.worker.app import DEFAULT_QUEUE
from services.worker.db import session_factory
from services.worker.enqueue import enqueue_job

log = logging.getLogger(__name__)


def queue_of(session: Session, job_id: str) -> str:
    return str(session.scalar(select(Job.queue).where(Job.id == job_id)) or DEFAULT_QUEUE)


def reap_once(settings: Any) -> list[str]:
    """Re-queue (or fail, past ``max_restarts``) every job with an expired lease; returns the
    ids of the jobs that were re-queued and enqueued again."""
    with session_factory(settings).begin() as session:
        requeued_ids, _failed = reap_expired_leases(session)
        requeued = [(job_id, queue_of(session, job_id)) for job_id in requeued_ids]
    # Enqueue after the commit: a worker that takes the message must see the job queued.
    for job_id, queue in requeued:
        enqueue_job(settings, job_id, queue)
        log.warning("job %s lost its worker; re-queued on %s", job_id, queue)
    return [job_id for job_id, _ in requeued]


class LeaseReaper:
    """A daemon thread calling ``reap_once`` every ``interval_s`` (``ACCUM_REAPER_INTERVAL_S``)."""

    def __init__(self, settings: Any, interval_s: float | None = None) -> None:
        self.settings = settings
        self.interval_s = float(interval_s or settings.reaper_interval_s)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accum-lease-reaper", daemon=True)

    def start(self) -> LeaseReaper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                reap_once(self.settings)
            except Exception:  # keep reaping after a database or broker blip
                log.exception("lease reaper pass failed; retrying in %.1fs", self.interval_s)
