"""``LocalStore``: a directory (a local disk, or an NFS share mounted on every node)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from services.artifacts.base import (
    CHUNK_BYTES,
    ArtifactStoreError,
    ObjectInfo,
    ObjectMissing,
    StoreUnavailable,
    check_key,
    download,
    hashed_chunks,
    is_temp,
    temp_name,
    verify,
)


class LocalStore:
    """Objects are files under ``root``; a put is temp file, fsync, rename (atomic)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, source: Path, sha256: str | None = None) -> ObjectInfo:
        dest = self._path(key)
        temp = dest.parent / temp_name(dest.name)
        digest = hashlib.sha256()
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with source.open("rb") as src, temp.open("wb") as out:
                for chunk in hashed_chunks(src, digest):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            verify(self.url, key, sha256, digest.hexdigest(), "uploading")
            os.replace(temp, dest)
        except ArtifactStoreError:
            temp.unlink(missing_ok=True)
            raise
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise StoreUnavailable(f"cannot write {key} to {self.url}: {exc}") from exc
        return ObjectInfo(key, dest.stat().st_size, digest.hexdigest())

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
