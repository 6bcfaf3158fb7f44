"""``ACCUM_RETENTION_DAYS``: delete the checkpoints of jobs finished longer ago (every object
of a sharded one), except each job's final and best one. Objects first, then rows: a failure
in between leaves rows of expired checkpoints whose objects are gone (the next sweep deletes them), never objects no row lists
under a job that will not run again to sweep them. Runs from the reaper loop, at most once per
``EVERY_S`` per process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from services.artifacts import ArtifactStoreError, delete_checkpoint, open_store
from services.jobdb.checkpoints import delete_checkpoint_rows
from services.jobdb.retention import checkpoints_past_retention
from services.jobdb.sessions import session_factory
from services.settings import Settings

log = logging.getLogger(__name__)

EVERY_S = 3600.0
_last = {"at": -float("inf")}


def sweep_retention(
    settings: Settings, clock: Callable[[], float] = time.time, force: bool = False
) -> list[str]:
    """Delete what retention allows; returns the deleted keys (nothing when disabled). Runs
    at most once an hour unless ``force``; ``clock`` (the reaper's) dates the cutoff."""
    if not settings.retention_days or (not force and time.monotonic() - _last["at"] < EVERY_S):
        return []
    _last["at"] = time.monotonic()
    cutoff = datetime.fromtimestamp(clock(), UTC) - timedelta(days=settings.retention_days)
    sessions = session_factory(settings)
    with sessions() as session:
        doomed = [(c.job_id, c.step, c.key) for c in checkpoints_past_retention(session, cutoff)]
    store = open_store(settings.artifacts_url)
    by_job: dict[str, list[int]] = {}
    for job_id, step, key in doomed:
        try:
            delete_checkpoint(store, key)
        except ArtifactStoreError as exc:
            log.warning("retention: could not delete %s: %s (next sweep)", key, exc)
            continue
        by_job.setdefault(job_id, []).append(step)
    with sessions.begin() as session:
        for job_id, steps in by_job.items():
            delete_checkpoint_rows(session, job_id, steps)
    keys = [key for job_id, step, key in doomed if step in by_job.get(job_id, ())]
    if keys:
        log.info("retention: deleted %d checkpoints of jobs finished over %g days ago",
                 len(keys), settings.retention_days)
    return keys
