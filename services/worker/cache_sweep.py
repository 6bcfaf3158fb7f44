"""A node's cache forgets deleted jobs: ``sweep_deleted_jobs(settings)`` drops the cached and
staged files of every job the database no longer holds.

    Registration(settings, name, queues, on_beat=lambda: sweep_deleted_jobs(settings))

`DELETE /v1/jobs/{id}` removes the job's objects and rows, but it cannot reach the nodes that
cached its checkpoints (a resume, a warm start, an upload adopted into the cache); without the
sweep they stayed until LRU eviction (10.9 MB and 7.3 MB found 20 minutes after a delete).
Each worker sweeps its cache on its registry heartbeat, and ``node_cache`` refuses to serve a
file of a job gone in between (``NodeCache.job_exists``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from sqlalchemy import select

from services.artifacts.cache import NodeCache
from services.jobdb.models import Job
from services.jobdb.sessions import session_factory
from services.settings import Settings

log = logging.getLogger(__name__)


def existing_jobs(settings: Settings, job_ids: Collection[str]) -> set[str]:
    with session_factory(settings)() as session:
        return set(session.scalars(select(Job.id).where(Job.id.in_(list(job_ids)))))


def job_exists(settings: Settings) -> Callable[[str], bool]:
    return lambda job_id: bool(existing_jobs(settings, [job_id]))


def sweep_deleted_jobs(settings: Settings) -> list[str]:
    """Drop the files of the cached jobs that no longer exist; returns their ids."""
    cache = NodeCache(settings.cache_path, settings.cache_max_bytes)
    cached = cache.job_ids()
    if not cached:
        return []
    gone = sorted(set(cached) - existing_jobs(settings, cached))
    for job_id in gone:
        cache.drop_job(job_id)
    if gone:
        log.info("node cache: dropped the files of %d deleted job(s): %s", len(gone), ", ".join(gone))
    return gone
