"""The worker's two places for checkpoints: the artifact store (one per process) and this
node's cache with its staging directories.

    store = artifact_store(settings)   # the same object for every upload, fetch and sweep
    cache = node_cache(settings)
"""

from __future__ import annotations

import functools
import os

from services.artifacts import ArtifactStore, open_store
from services.artifacts.cache import NodeCache
from services.settings import Settings
from services.worker.cache_sweep import job_exists


def artifact_store(settings: Settings) -> ArtifactStore:
    """The configured artifact store: one per process and URL (its client and connections
    reused by every upload, fetch and sweep). Keyed by the process id too: a prefork child
    opens its own, never sharing the connections of the parent it was forked from."""
    return _store_at(settings.artifacts_url, os.getpid())


@functools.cache
def _store_at(url: str, pid: int) -> ArtifactStore:
    return open_store(url)


def node_cache(settings: Settings) -> NodeCache:
    # A job deleted since its row was read is not served from here (services.worker.cache_sweep).
    return NodeCache(settings.cache_path, settings.cache_max_bytes, job_exists=job_exists(settings))
