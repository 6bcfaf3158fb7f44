"""``S3Store``: ``s3://bucket/prefix`` on any S3-compatible service (AWS, MinIO, Ceph, R2).

Built on obstore (Rust's object_store): a synchronous API without an event loop thread,
multipart uploads with parts sent concurrently, ranged reads and presigned URLs, and a
small import (no botocore) for the API process. s3fs was measured beside it
(``bench/service/artifacts.py``, docs/benchmarks.md). Credentials, endpoint and region come only from
the standard AWS environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``, ``AWS_REGION``), which obstore reads itself: nothing is hard-coded, so a
MinIO in any region works.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import obstore
from obstore.store import S3Store as ObjectStoreS3

from services.artifacts.base import (
    CHUNK_BYTES,
    ArtifactStoreError,
    ChecksumMismatch,
    ObjectInfo,
    ObjectMissing,
    StoreUnavailable,
    check_key,
    check_size,
    download,
    hashed_chunks,
    verify,
)

# A store that does not answer within these is down as far as a training job is concerned:
# obstore's own default (10 retries, 180 s) would hold a job past its lease timeout.
RETRY = {"max_retries": 3, "retry_timeout": timedelta(seconds=10),
         "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2),
                     "base": 2}}
CLIENT = {"connect_timeout": "3s", "timeout": "120s"}


class S3Store:
    """Objects under ``prefix`` in ``bucket``."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"{url!r} is not an s3://bucket/prefix URL")
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parts.netloc, parts.path.strip("/")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
        client: dict[str, Any] = dict(CLIENT, allow_http=endpoint.startswith("http://"))
        self._store = ObjectStoreS3(
            self.bucket, prefix=self.prefix or None, client_options=client,  # type: ignore[arg-type]
            retry_config=RETRY,  # type: ignore[arg-type]
            # Signed payloads whatever AWS_UNSIGNED_PAYLOAD says: the server checks every
            # request body's sha256, which is what lets a put trust its writer's sha256.
            unsigned_payload=False,
        )

    def put(self, key: str, source: Path, sha256: str | None = None, *,
            size: int | None = None) -> ObjectInfo:
        check_key(key)
        digest = hashlib.sha256()
        try:
            if sha256 is not None and size is not None:
                check_size(self.url, key, source, size)
                # The writer's sha256 stands: obstore reads the file itself (no GIL held) and
                # signs each request's payload sha256, which the server checks (SigV4).
                obstore.put(self._store, key, source, use_multipart=size > CHUNK_BYTES,
                            chunk_size=CHUNK_BYTES, max_concurrency=4)
                sent = sha256
            else:
                size = source.stat().st_size
                with source.open("rb") as f:
                    # Parts go out while the file is read and hashed: the sha256 is of the
                    # bytes sent, and S3 completes a multipart upload atomically.
                    obstore.put(self._store, key, hashed_chunks(f, digest),
                                use_multipart=size > CHUNK_BYTES, chunk_size=CHUNK_BYTES,
                                max_concurrency=4)
                sent = digest.hexdigest()
        except Exception as exc:
            raise self._error("upload", key, exc) from exc
        try:
            verify(self.url, key, sha256, sent, "uploading")
        except ChecksumMismatch:
            self.delete(key)
            raise
        stored = self.head(key)
        if stored is None or stored.size != size:
            raise ChecksumMismatch(
                f"uploaded {key} to {self.url} but the store holds "
                f"{'nothing' if stored is None else f'{stored.size} bytes'}, not {size}"
            )
        return ObjectInfo(key, size, sent)

    def get(self, key: str, dest: Path, sha256: str | None = None) -> ObjectInfo:
        return download(self, key, dest, sha256)

    def open(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        check_key(key)
        options: dict[str, Any] = {}
        if end is not None:
            if end <= start:
                return iter(())
            options["range"] = (start, end)
        elif start:
            options["range"] = {"offset": start}
        try:
            result = obstore.get(self._store, key, options=options or None)  # type: ignore[arg-type]
        except Exception as exc:
            raise self._error("read", key, exc) from exc
        return self._chunks(key, result.stream(min_chunk_size=CHUNK_BYTES))

    def _chunks(self, key: str, stream: Any) -> Iterator[bytes]:
        try:
            for chunk in stream:
                yield bytes(chunk)
        except Exception as exc:
            raise self._error("read", key, exc) from exc

    def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        try:
            meta = obstore.head(self._store, key)
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._error("stat", key, exc) from exc
        return ObjectInfo(key, int(meta["size"]))

    def delete(self, key: str) -> None:
        check_key(key)
        try:
            obstore.delete(self._store, key)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._error("delete", key, exc) from exc

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        try:
            found = [
                ObjectInfo(meta["path"], int(meta["size"]))
                for batch in obstore.list(self._store, prefix.rstrip("/") or None)
                for meta in batch
                if meta["path"].startswith(prefix)
            ]
        except Exception as exc:
            raise self._error("list", prefix, exc) from exc
        return sorted(found, key=lambda o: o.key)

    def presign(self, key: str, expires_s: int) -> str | None:
        check_key(key)
        try:
            return str(obstore.sign(self._store, "GET", key, timedelta(seconds=expires_s)))
        except Exception as exc:
            raise self._error("sign", key, exc) from exc

    def _error(self, verb: str, key: str, exc: Exception) -> ArtifactStoreError:
        """obstore's errors (a Rust debug dump over many lines) as one line naming the store."""
        if isinstance(exc, ArtifactStoreError):
            return exc
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, FileNotFoundError):
            return ObjectMissing(f"{key} does not exist in {self.url}")
        return StoreUnavailable(f"cannot {verb} {key} at {self.url}: {first_line}")

    def __repr__(self) -> str:
        return f"S3Store({self.url})"
