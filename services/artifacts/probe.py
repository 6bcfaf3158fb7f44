"""Is the artifact store usable from here? A write-read-delete of a small object.

    check_writable(store)          # raises ArtifactStoreError naming the URL and the error
    probe = CachedProbe(store, 30) # /readyz: at most one round trip per 30 s
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
    """``check_writable`` at most once per ``ttl_s``; the last outcome is answered meanwhile."""

    def __init__(self, store: ArtifactStore, ttl_s: float = 30.0) -> None:
        self.store, self.ttl_s = store, ttl_s
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._reason: str | None = None
        self.failures = 0

    def __call__(self) -> str | None:
        """None when the store worked at the last check, else a one-line reason."""
        with self._lock:
            if time.monotonic() - self._at < self.ttl_s:
                return self._reason
            try:
                check_writable(self.store)
                self._reason = None
            except (ArtifactStoreError, OSError) as exc:
                self._reason = f"{type(exc).__name__}: {exc}"[:300]
                self.failures += 1
            self._at = time.monotonic()
            return self._reason
