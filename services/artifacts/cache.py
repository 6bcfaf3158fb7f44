"""A node's bounded cache of store objects (``ACCUM_CACHE_DIR``), least recently used first out.

    cache = NodeCache(settings.cache_path, settings.cache_max_bytes)
    path = cache.fetch(store, "<job>/<step>.pt", sha256)   # downloaded once, verified every time
    cache.adopt("<job>/<step>.pt", staged_file)            # a checkpoint this node just uploaded

A cached file is checked against the row's sha256 on every use, so a file damaged on this disk
is fetched again instead of loaded. Use is recorded as the file's mtime; eviction removes the
oldest until the cache fits. Several worker processes may share a cache: files arrive by
rename, and removing a file another process is reading does not disturb that reader (POSIX).

A deleted job's files go too: the worker's sweep (``services.worker.cache_sweep``) calls
``drop_job`` for each job directory whose job is gone, and with ``job_exists`` a cached file
of such a job is dropped instead of served.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from services.artifacts.base import (
    ArtifactStore,
    ChecksumMismatch,
    ObjectMissing,
    check_key,
    sha256_of,
)

log = logging.getLogger(__name__)


class NodeCache:
    def __init__(self, root: Path, max_bytes: int,
                 job_exists: Callable[[str], bool] | None = None) -> None:
        self.root = root
        self.objects = root / "objects"
        self.max_bytes = max_bytes
        self.job_exists = job_exists

    def path_for(self, key: str) -> Path:
        return self.objects / check_key(key)

    def staging_dir(self, job_id: str) -> Path:
        """Where a job's trainer writes checkpoints before they are uploaded."""
        return self.root / "staging" / check_key(job_id)

    def fetch(self, store: ArtifactStore, key: str, sha256: str) -> Path:
        """The object's local copy, downloaded when absent or damaged; raises the store's errors
        (``StoreUnavailable``, ``ObjectMissing``, ``ChecksumMismatch``). The key's job deleted
        meanwhile (``job_exists``): its files are dropped and ``ObjectMissing`` raised."""
        path = self.path_for(key)
        job_id = key.split("/", 1)[0]
        if self.job_exists is not None and not self.job_exists(job_id):
            self.drop_job(job_id)
            raise ObjectMissing(f"{key}: job {job_id} was deleted; its checkpoints are gone")
        if path.is_file():
            if sha256_of(path)[0] == sha256:
                with contextlib.suppress(OSError):  # a read-only cache still serves its files
                    os.utime(path)
                return path
            log.warning("cached %s does not match its sha256: fetching it again", key)
            path.unlink(missing_ok=True)
        info = store.get(key, path, sha256)
        if info.sha256 != sha256:  # get checked it; this guards a store that did not
            path.unlink(missing_ok=True)
            raise ChecksumMismatch(f"{key} from {store.url}: sha256 {info.sha256}, expected {sha256}")
        self.evict(keep=path)
        return path

    def adopt(self, key: str, staged: Path) -> Path:
        """Move a file this node wrote (and uploaded) into the cache: a resume here is warm."""
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, path)
        self.evict(keep=path)
        return path

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Remove least recently used files until the cache holds at most ``max_bytes``."""
        files = []
        for path in self.objects.rglob("*") if self.objects.is_dir() else []:
            try:
                stat = path.stat()
            except FileNotFoundError:  # another process evicted it
                continue
            if path.is_file():
                files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        removed = []
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            path.unlink(missing_ok=True)
            total -= size
            removed.append(path)
        return removed

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.objects.rglob("*") if p.is_file()) \
            if self.objects.is_dir() else 0

    def job_ids(self) -> list[str]:
        """The jobs with files here: cached checkpoints or staged ones."""
        folders = [self.objects, self.root / "staging"]
        return sorted({p.name for folder in folders if folder.is_dir() for p in folder.iterdir() if p.is_dir()})

    def drop_job(self, job_id: str) -> None:
        """Remove the job's cached and staged files."""
        for folder in (self.objects, self.root / "staging"):
            shutil.rmtree(folder / check_key(job_id), ignore_errors=True)
