"""Is the artifact store usable from here? A write-read-delete of a small object.

    check_writable(store)          # raises ArtifactStoreError naming the URL and the error
    probe = CachedProbe(store, 5)  # /readyz: one probe per 5 s at most, answered in 0.5 s
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

from services.artifacts.base import ArtifactStore, ArtifactStoreError, ChecksumMismatch

PROBE_PREFIX = "_probe"  # never a job id (ids are 26 base32 characters)


def check_writable(store: ArtifactStore) -> None:
    """Put, read back and delete ``_probe/<host>-<random>``; raises what failed."""
    key = f"{PROBE_PREFIX}/{socket.gethostname()}-{uuid.uuid4().hex[:12]}"
    payload = f"accum probe {key}\n".encode()
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "probe"
        source.write_bytes(payload)
        try:
            store.put(key, source)
            if b"".join(store.open(key)) != payload:
                raise ChecksumMismatch(f"{key} at {store.url} read back other bytes than written")
        finally:
            # The first error is the one to report; a stray probe object is harmless.
            with contextlib.suppress(ArtifactStoreError):
                store.delete(key)


def startup_check(store: ArtifactStore) -> str | None:
    """None when the store is writable, else the one line a worker refuses to start with."""
    try:
        check_writable(store)
    except (ArtifactStoreError, OSError) as exc:
        return (f"accum worker: the artifact store {store.url} is not writable ({exc}); check "
                "ACCUM_ARTIFACTS_URL and the AWS_* environment (credentials, AWS_ENDPOINT_URL, "
                "AWS_REGION)" + ("" if not store.url.startswith("file:") else
                                 f"; the directory must exist or be creatable by uid {os.getuid()}"))
    return None


class CachedProbe:
    """``check_writable`` at most once per ``ttl_s``, on a thread of its own: a call answers
    within ``wait_s`` whatever the store does (a fresh outcome when the probe is that quick,
    else the last one), and a probe with no answer after ``timeout_s`` counts as a failure.

    Before, the probe ran inside the request under a 5 s deadline and its outcome was kept for
    30 s: a 20 s outage never showed, a 45 s one showed for 17 s after recovery, and each answer
    took 5 s while the store hung. A hung probe is left to end on its own (its outcome is
    ignored); the next starts once ``ttl_s`` has passed since it was given up on.
    """

    def __init__(self, store: ArtifactStore, ttl_s: float = 5.0, timeout_s: float = 3.0,
                 wait_s: float = 0.5) -> None:
        self.store, self.ttl_s, self.timeout_s, self.wait_s = store, ttl_s, timeout_s, wait_s
        self._lock = threading.Lock()
        self._at = -float("inf")  # when the last outcome was known (monotonic)
        # Not ready until a probe said so (a first probe slower than wait_s: 503 meanwhile).
        self._reason: str | None = "not probed yet"
        self._running: threading.Event | None = None  # set when the probe in flight ends
        self._running_since = 0.0
        self.failures = 0

    def __call__(self) -> str | None:
        """None when the store worked at the last check, else a one-line reason."""
        with self._lock:
            now = time.monotonic()
            if self._running is not None and now - self._running_since > self.timeout_s:
                self._running = None  # given up on: its late outcome is ignored
                self._record(f"no answer within {self.timeout_s:g}s", now)
            if now - self._at < self.ttl_s:
                return self._reason
            if self._running is None:
                self._running, self._running_since = threading.Event(), now
                threading.Thread(target=self._probe, args=(self._running,), daemon=True,
                                 name="accum-store-probe").start()
            running = self._running
        running.wait(self.wait_s)
        with self._lock:
            return self._reason

    def _probe(self, done: threading.Event) -> None:
        reason: str | None = None
        try:
            check_writable(self.store)
        except (ArtifactStoreError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"[:300]
        with self._lock:
            if self._running is done:
                self._running = None
                self._record(reason, time.monotonic())
        done.set()

    def _record(self, reason: str | None, at: float) -> None:
        self._reason, self._at = reason, at
        if reason is not None:
            self.failures += 1
