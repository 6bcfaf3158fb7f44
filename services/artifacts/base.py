"""The artifact store's contract: keys, object facts, errors, and the ``ArtifactStore`` protocol.

A key is a ``/``-separated path relative to the store's root (``<job>/<step>.pt``); rows in the
database hold keys, never a node's path, so moving or re-mounting the store breaks nothing.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

CHUNK_BYTES = 8 * 1024 * 1024  # read/hash granularity; also S3's multipart part size


@dataclass(frozen=True)
class ObjectInfo:
    """What the store knows about one object (``sha256`` when it was recorded at put)."""

    key: str
    size: int
    sha256: str | None = None


class ArtifactStoreError(Exception):
    """Any failure of the store; the message names the store's URL and the key."""


class StoreUnavailable(ArtifactStoreError):
    """The store could not be reached or refused the request (network, credentials, outage)."""


class ObjectMissing(ArtifactStoreError, FileNotFoundError):
    """The object does not exist."""


class ChecksumMismatch(ArtifactStoreError):
    """The bytes written or read do not have the sha256 (or size) they should."""


@runtime_checkable
class ArtifactStore(Protocol):
    """Where checkpoints live. Implementations: ``LocalStore`` (a directory, ``file://``) and
    ``S3Store`` (``s3://bucket/prefix`` on any S3-compatible service)."""

    url: str

    def put(self, key: str, source: Path, sha256: str | None = None, *,
            size: int | None = None) -> ObjectInfo:
        """Upload the file ``source`` to ``key`` (multipart when large); returns only once the
        object is complete and its size and sha256 were checked (``ChecksumMismatch`` when
        ``sha256`` is given and the bytes sent differ).

        With ``size`` too, ``sha256`` and ``size`` are the file's facts as its writer recorded
        them (the trainer hashed the bytes it wrote): the file is not read a second time to
        hash it; the file and the stored object must have ``size`` bytes, and the transfer is
        checked by the store itself (S3: each request's payload sha256 is signed, SigV4, and
        checked by the server; a local store copies within the machine)."""
        ...

    def get(self, key: str, dest: Path, sha256: str | None = None) -> ObjectInfo:
        """Download ``key`` to the file ``dest`` (atomically: temp file, rename), checking
        ``sha256`` when given."""
        ...

    def open(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The bytes ``[start, end)`` of ``key`` as chunks (the whole object by default)."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """The object's facts, or None when it does not exist."""
        ...

    def delete(self, key: str) -> None:
        """Delete ``key``; a missing object is not an error."""
        ...

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects whose key starts with ``prefix`` (a folder: ``<job>/``), sorted by key."""
        ...

    def presign(self, key: str, expires_s: int) -> str | None:
        """A URL anyone can GET for ``expires_s`` seconds, or None when the store has none."""
        ...


def check_key(key: str) -> str:
    """Refuse keys that could leave the store's root (``..``, absolute, empty parts)."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"artifact key {key!r} must be a relative path like '<job>/<step>.pt'")
    return key


def sha256_of(path: Path) -> tuple[str, int]:
    """(hex sha256, size) of a file, read in chunks."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def hashed_chunks(f: BinaryIO, digest: hashlib._Hash, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Read ``f`` in chunks, feeding each into ``digest`` as it goes past."""
    while chunk := f.read(chunk_bytes):
        digest.update(chunk)
        yield chunk


def temp_name(name: str) -> str:
    """``.<name>.<random>.tmp``: accumcore's own temp-file pattern, so one sweep knows both; an
    interrupted write leaves only such a file, never a partial file under its final name."""
    return f".{name}.{uuid.uuid4().hex[:8]}.tmp"


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def download(store: ArtifactStore, key: str, dest: Path, sha256: str | None) -> ObjectInfo:
    """``store.get``: stream ``key`` into a temp file beside ``dest``, check the sha256, rename."""
    temp = dest.parent / temp_name(dest.name)
    digest = hashlib.sha256()
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with temp.open("wb") as out:
            for chunk in store.open(key):
                digest.update(chunk)
                out.write(chunk)
        verify(store.url, key, sha256, digest.hexdigest(), "downloading")
        os.replace(temp, dest)
    finally:
        temp.unlink(missing_ok=True)
    return ObjectInfo(key, dest.stat().st_size, digest.hexdigest())


def check_size(url: str, key: str, source: Path, size: int) -> None:
    """The file to upload has the size its writer recorded (not truncated or replaced since)."""
    actual = source.stat().st_size
    if actual != size:
        raise ChecksumMismatch(f"uploading {key} to {url}: {source} has {actual} bytes but its "
                               f"writer recorded {size} (changed since it was written)")


def verify(url: str, key: str, expected: str | None, actual: str, what: str) -> None:
    if expected is not None and expected != actual:
        raise ChecksumMismatch(
            f"{what} {key} at {url}: sha256 {actual} but {expected} was expected "
            "(corrupted in transit or on the store)"
        )
