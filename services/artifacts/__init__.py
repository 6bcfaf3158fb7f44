"""Artifact store (checkpoints): a local directory or ``s3://bucket/prefix``. Torch-free.

    store = open_store(settings.artifacts_url)     # file:///srv/accum/artifacts or s3://...
    info = store.put("<job>/<step>.pt", local_file, sha256)   # returns once complete and verified
    store.get("<job>/<step>.pt", cache_file, sha256)

A sharded (FSDP) checkpoint is a folder of objects, ``<job>/<step>/``: every rank's DCP files,
``manifest.json`` (each file's size and sha256: the key its row holds) and, when the worker
made one, ``consolidated.pt`` (the full state in one file: what a download serves).
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
    "consolidated_key",
    "delete_checkpoint",
    "is_sharded_key",
    "manifest_key",
    "merged_key",
    "open_store",
    "sha256_of",
]


def checkpoint_key(job_id: str, step: int) -> str:
    """The key of a job's checkpoint at ``step``: what checkpoint rows hold."""
    return f"{job_id}/{step}.pt"


def merged_key(job_id: str) -> str:
    """The key of a LoRA job's merged model (``peft.merge``): its ``save_pretrained`` files as
    one uncompressed tar, what ``GET /v1/jobs/{id}/merged`` serves."""
    return f"{job_id}/merged.tar"


SHARD_MANIFEST = "manifest.json"
CONSOLIDATED = "consolidated.pt"


def manifest_key(job_id: str, step: int) -> str:
    """The key a sharded checkpoint's row holds: its manifest, under ``<job>/<step>/``."""
    return f"{job_id}/{step}/{SHARD_MANIFEST}"


def is_sharded_key(key: str) -> bool:
    """Whether a row's key is a sharded checkpoint's manifest (its objects: ``key``'s folder)."""
    return key.endswith(f"/{SHARD_MANIFEST}")


def consolidated_key(key: str) -> str:
    """The consolidated file beside a sharded checkpoint's manifest ``key``."""
    return f"{key.rsplit('/', 1)[0]}/{CONSOLIDATED}"


def delete_checkpoint(store: ArtifactStore, key: str) -> None:
    """Delete a checkpoint's objects: the file, or every object of a sharded one's folder (the
    manifest last). Raises the store's errors; what is left, the next try deletes."""
    if not is_sharded_key(key):
        store.delete(key)
        return
    for stored in store.list(key.rsplit("/", 1)[0] + "/"):
        if stored.key != key:
            store.delete(stored.key)
    store.delete(key)


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
