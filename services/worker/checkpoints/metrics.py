"""Prometheus instruments of this worker's artifact store traffic: upload seconds and bytes,
fetch seconds, store errors by operation and kind.

    stored = observe_upload(lambda: store.put(key, path, sha256, size=size))
    path = observe_fetch(lambda: cache.fetch(store, key, sha256))
    count_error("delete", exc)

Recorded wherever the traffic happens (the worker's own process, a prefork child, a DDP rank);
``services.worker.metrics_server`` serves them, summed over those processes. The instruments are
made on first use, after the server chose prometheus_client's multiprocess mode, and are not
registered anywhere else (the API's registries are its own).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Counter, Histogram

from services.artifacts import ArtifactStoreError, ObjectInfo

T = TypeVar("T")

SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
BYTES_BUCKETS = (1e6, 1e7, 1e8, 1e9, 1e10, 1e11)  # 1 MB .. 100 GB checkpoints


@dataclass(frozen=True)
class Instruments:
    upload_seconds: Histogram
    upload_bytes: Histogram
    fetch_seconds: Histogram
    store_errors: Counter


@functools.cache
def instruments() -> Instruments:
    return Instruments(
        upload_seconds=Histogram(
            "accum_worker_checkpoint_upload_seconds",
            "Seconds of each checkpoint put to the artifact store that succeeded (size checked).",
            buckets=SECONDS_BUCKETS, registry=None,
        ),
        upload_bytes=Histogram(
            "accum_worker_checkpoint_upload_bytes",
            "Size of each checkpoint uploaded to the artifact store, in bytes.",
            buckets=BYTES_BUCKETS, registry=None,
        ),
        fetch_seconds=Histogram(
            "accum_worker_checkpoint_fetch_seconds",
            "Seconds to get a checkpoint into the node cache (download and sha256, or the "
            "sha256 of a cached copy) to resume or warm-start from it.",
            buckets=SECONDS_BUCKETS, registry=None,
        ),
        store_errors=Counter(
            "accum_worker_store_errors",
            "Failed artifact store operations (each try, retries included), by operation "
            "(upload, fetch, delete) and error (StoreUnavailable, ObjectMissing, ChecksumMismatch).",
            ("operation", "error"), registry=None,
        ),
    )


def count_error(operation: str, exc: ArtifactStoreError) -> None:
    instruments().store_errors.labels(operation, type(exc).__name__).inc()


def timed(operation: str, call: Callable[[], T]) -> tuple[T, float]:
    """``call()`` and its seconds; its ``ArtifactStoreError`` counted under ``operation``."""
    started = time.perf_counter()
    try:
        return call(), time.perf_counter() - started
    except ArtifactStoreError as exc:
        count_error(operation, exc)
        raise


def observe_upload(put: Callable[[], ObjectInfo]) -> ObjectInfo:
    """``put()``, with its seconds and bytes observed, or its error counted."""
    stored, seconds = timed("upload", put)
    instruments().upload_seconds.observe(seconds)
    instruments().upload_bytes.observe(stored.size)
    return stored


def observe_fetch(fetch: Callable[[], T]) -> T:
    """``fetch()``, with its seconds observed, or its error counted."""
    result, seconds = timed("fetch", fetch)
    instruments().fetch_seconds.observe(seconds)
    return result
