"""``LocalStore``: a directory (a local disk, or an NFS share mounted on every node)."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

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
    is_temp,
    temp_name,
    verify,
)


class LocalStore:
    """Objects are files under ``root``; a put is temp file, fsync, rename (atomic), fsync of
    the directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, source: Path, sha256: str | None = None, *,
            size: int | None = None) -> ObjectInfo:
        dest = self._path(key)
        temp = dest.parent / temp_name(dest.name)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            if sha256 is not None and size is not None:  # the writer's facts: copy, no hashing
                check_size(self.url, key, source, size)
                shutil.copyfile(source, temp)
                sent = sha256
            else:
                sent = copy_hashed(source, temp)
                verify(self.url, key, sha256, sent, "uploading")
            # This copy is the durable one (the trainer's staged file may not be fsynced):
            # its bytes, then its name, survive a power cut before the row is written.
            fsync_file(temp)
            os.replace(temp, dest)
            fsync_dir(dest.parent)
        except ArtifactStoreError:
            temp.unlink(missing_ok=True)
            raise
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise StoreUnavailable(f"cannot write {key} to {self.url}: {exc}") from exc
        stored = dest.stat().st_size
        if size is not None and stored != size:
            raise ChecksumMismatch(f"wrote {key} to {self.url} but it holds {stored} bytes, not {size}")
        return ObjectInfo(key, stored, sent)

    def get(self, key: str, dest: Path, sha256: str | None = None) -> ObjectInfo:
        return download(self, key, dest, sha256)

    def open(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        path = self._path(key)
        try:
            f = path.open("rb")
        except FileNotFoundError as exc:
            raise ObjectMissing(f"{key} does not exist in {self.url}") from exc
        except OSError as exc:
            raise StoreUnavailable(f"cannot read {key} from {self.url}: {exc}") from exc
        return _read_range(f, start, end)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            return ObjectInfo(key, self._path(key).stat().st_size)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailable(f"cannot stat {key} in {self.url}: {exc}") from exc

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot delete {key} from {self.url}: {exc}") from exc

    def remove_temp_files(self, prefix: str) -> list[Path]:
        """Temp files of puts interrupted under ``prefix`` (a killed worker's leftovers)."""
        base = self.root / prefix
        temps = sorted(p for p in base.iterdir() if is_temp(p.name)) if base.is_dir() else []
        for temp in temps:
            temp.unlink(missing_ok=True)
        return temps

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = self.root / prefix.rstrip("/") if prefix.endswith("/") else self.root
        if not base.is_dir():
            return []
        found = []
        for path in base.rglob("*"):
            key = path.relative_to(self.root).as_posix()
            if path.is_file() and key.startswith(prefix) and not is_temp(path.name):
                found.append(ObjectInfo(key, path.stat().st_size))
        return sorted(found, key=lambda o: o.key)

    def presign(self, key: str, expires_s: int) -> str | None:
        return None  # a node's path means nothing to a client: the API streams it instead

    def __repr__(self) -> str:
        return f"LocalStore({self.url})"


def copy_hashed(source: Path, dest: Path) -> str:
    """Copy ``source`` to ``dest``, returning the sha256 of the bytes copied."""
    digest = hashlib.sha256()
    with source.open("rb") as src, dest.open("wb") as out:
        for chunk in hashed_chunks(src, digest):
            out.write(chunk)
    return digest.hexdigest()


def fsync_file(path: Path) -> None:
    with path.open("rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(directory: Path) -> None:
    """Make a rename into ``directory`` durable (skipped where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_range(f: BinaryIO, start: int, end: int | None) -> Iterator[bytes]:
    try:
        f.seek(start)
        left = None if end is None else max(0, end - start)
        while left is None or left > 0:
            chunk = f.read(CHUNK_BYTES if left is None else min(CHUNK_BYTES, left))
            if not chunk:
                return
            if left is not None:
                left -= len(chunk)
            yield chunk
    finally:
        f.close()
