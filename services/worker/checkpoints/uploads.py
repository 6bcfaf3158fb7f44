"""A job's checkpoints, from the node's staging directory to the artifact store, in the background.

The trainer writes ``<step>.pt`` into the staging directory at a window boundary (fast, local)
and goes on training while this module uploads it; the row is written only once the object is
complete and verified, so no row ever points at a partial object. At most one upload is in
flight per job: ``submit`` waits for the previous one, so a store slower than the checkpoint
interval slows training instead of piling up files (and requests: ray #47937). ``wait`` is
called before a job is marked finished or handed back, so the final checkpoint and the one
written on SIGTERM are in the store first.

A store outage is waited out for up to a lease timeout (uploads retried); past it the upload
fails with ``StoreUnavailable`` and the runner hands the attempt back as a transient fault.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from services.artifacts import (
    ArtifactStore,
    ArtifactStoreError,
    ObjectInfo,
    checkpoint_key,
    delete_checkpoint,
    is_sharded_key,
)
from services.artifacts.base import StoreUnavailable
from services.artifacts.cache import NodeCache
from services.worker.checkpoints.metrics import count_error, observe_upload
from services.worker.retry import retry_while_unreachable

log = logging.getLogger(__name__)

UPLOAD_NICE = 10  # added to the process's nice value for the upload thread

# What the caller does once the object is in the store (given it and the upload's seconds):
# write its row, and return the keys of the checkpoints that row's retention pruned (deleted
# from the store after the commit).
Record = Callable[[ObjectInfo, float], list[str]]


def background_priority() -> None:
    """Lower this thread's CPU priority (Linux: a thread is its own scheduling entity): on a
    node whose cores are all busy, the trainer's threads run first and the upload takes the
    idle time (hashing and sending a checkpoint is CPU work too)."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), UPLOAD_NICE)


class ArtifactQuotaExceeded(RuntimeError):
    """The owner's checkpoints would pass ``ACCUM_MAX_ARTIFACT_BYTES_PER_OWNER``: a final
    failure (retrying fills nothing but the same quota)."""


class CheckpointUploads:
    """Uploads of one attempt's checkpoints (``submit``, ``wait``), and their deletion."""

    def __init__(self, store: ArtifactStore, cache: NodeCache, job_id: str, retry_for_s: float,
                 give_up: Callable[[], bool] = lambda: False) -> None:
        self.store, self.cache, self.job_id = store, cache, job_id
        self.retry_for_s = retry_for_s
        self.give_up = give_up
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.uploaded: list[ObjectInfo] = []

    @property
    def staging_dir(self) -> Path:
        return self.cache.staging_dir(self.job_id)

    def submit(self, path: Path, step: int, sha256: str, size: int, record: Record) -> None:
        """Upload ``path`` as step ``step`` in the background, then ``record`` it. ``sha256``
        and ``size`` are the trainer's (it hashed the bytes it wrote), so the file is sent
        without a second hashing pass (``ArtifactStore.put``). Waits for the previous upload
        first and raises its error, if it failed."""
        self.background(f"accum-upload-{step}", lambda: self._upload(path, step, sha256, size, record))

    def background(self, name: str, work: Callable[[], None]) -> None:
        """Run ``work`` in the background at a low priority, after the previous work (whose
        error this raises); ``wait`` raises the error of this one."""
        self.wait()

        def run() -> None:
            background_priority()
            try:
                work()
            except BaseException as exc:  # the store's, or the database's writing the row
                self._error = exc

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until the upload in flight (if any) is stored and recorded; raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def put(self, key: str, path: Path, sha256: str, size: int) -> ObjectInfo:
        """``path`` stored at ``key``, a store outage waited out (``retry_for_s``)."""
        return retry_while_unreachable(
            lambda: observe_upload(lambda: self.store.put(key, path, sha256, size=size)),
            what=f"job {self.job_id}: uploading {key} to {self.store.url}",
            for_s=self.retry_for_s, give_up=self.give_up,
            transient=lambda exc: isinstance(exc, StoreUnavailable),
        )

    def _upload(self, path: Path, step: int, sha256: str, size: int, record: Record) -> None:
        key = checkpoint_key(self.job_id, step)
        started = time.perf_counter()
        stored = self.put(key, path, sha256, size)
        self.delete(record(stored, time.perf_counter() - started))
        self.uploaded.append(stored)
        self.cache.adopt(key, path)

    def delete(self, keys: list[str]) -> None:
        """Delete pruned checkpoints' objects (after their rows' deletion committed; all of a
        sharded one's). One that cannot be deleted now is left for the next attempt's orphan
        sweep."""
        for key in keys:
            try:
                delete_checkpoint(self.store, key)
            except ArtifactStoreError as exc:
                count_error("delete", exc)
                log.warning("could not delete %s: %s (the next orphan sweep retries)", key, exc)
            if is_sharded_key(key):
                shutil.rmtree(self.cache.path_for(key).parent, ignore_errors=True)
            else:
                self.cache.path_for(key).unlink(missing_ok=True)
