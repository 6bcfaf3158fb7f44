"""Artifact store (checkpoints): a local directory or ``s3://bucket/prefix``. Torch-free.

    store = open_store(settings.artifacts_url)     # file:///srv/accum/artifacts or s3://...
    info = store.put("<job>/<step>.pt", local_file, sha256)   # returns once complete and verified
    store.get("<job>/<step>.pt", cache_file, sha256)
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from services.artifacts.base import (
    ArtifactStore,
    ArtifactStoreError,
    ChecksumMismatch,
    ObjectInfo,
    ObjectMissing,
    StoreUnavailable,
    sha256_of,
)
from services.artifacts.local import LocalStore

SCHEMES = ("file", "s3")

__all__ = [
    "SCHEMES",
    "ArtifactStore",
    "ArtifactStoreError",
    "ChecksumMismatch",
    "LocalStore",
    "ObjectInfo",
    "ObjectMissing",
    "StoreUnavailable",
    "checkpoint_key",
    "open_store",
    "sha256_of",
]


def checkpoint_key(job_id: str, step: int) -> str:
    """The key of a job's checkpoint at ``step``: what checkpoint rows hold."""
    return f"{job_id}/{step}.pt"


def open_store(url: str) -> ArtifactStore:
    """The store at ``url``: ``file:///path`` (or a plain path) or ``s3://bucket/prefix``."""
    scheme = urlsplit(url).scheme
    if scheme == "s3":
        # Imported here: obstore is the optional `s3` extra, so a local-only install runs
        # without it, and a missing one is named rather than an ImportError at start-up.
        try:
            from services.artifacts.s3 import S3Store
        except ImportError as exc:
            raise ValueError(f"artifact store URL {url!r} needs obstore: pip install "
                             "'accum[s3]'") from exc
        return S3Store(url)
    if scheme in ("file", ""):
        path = Path(unquote(urlsplit(url).path)) if scheme == "file" else Path(url)
        return LocalStore(path)
    raise ValueError(f"artifact store URL {url!r}: scheme must be one of {', '.join(SCHEMES)}")
