"""The node cache: fetched once and then served locally, the sha256 checked on every use (a
damaged copy is fetched again), least recently used files out first past the bound."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from services.artifacts import ChecksumMismatch, ObjectMissing, open_store
from services.artifacts.cache import NodeCache


def put(store_url: str, tmp_path: Path, key: str, size: int) -> str:
    data = os.urandom(size)
    source = tmp_path / "src"
    source.write_bytes(data)
    open_store(store_url).put(key, source)
    return hashlib.sha256(data).hexdigest()


def test_fetch_once_then_from_the_cache(artifacts_url: str, tmp_path: Path) -> None:
    store = open_store(artifacts_url)
    sha = put(artifacts_url, tmp_path, "j/1.pt", 1000)
    cache = NodeCache(tmp_path / "cache", 10_000)
    path = cache.fetch(store, "j/1.pt", sha)
    store.delete("j/1.pt")  # the store no longer has it: the cached copy serves
    assert cache.fetch(store, "j/1.pt", sha) == path
    path.write_bytes(b"damaged")  # a damaged copy is not trusted: fetched again, and gone
    with pytest.raises(ObjectMissing):
        cache.fetch(store, "j/1.pt", sha)


def test_a_wrong_sha256_is_refused(artifacts_url: str, tmp_path: Path) -> None:
    put(artifacts_url, tmp_path, "j/2.pt", 100)
    cache = NodeCache(tmp_path / "cache", 10_000)
    with pytest.raises(ChecksumMismatch):
        cache.fetch(open_store(artifacts_url), "j/2.pt", "0" * 64)
    assert not cache.path_for("j/2.pt").exists()


def test_least_recently_used_files_leave_first(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    cache = NodeCache(tmp_path / "cache", 2500)
    shas = {k: put(url, tmp_path, k, 1000) for k in ("a/1.pt", "b/1.pt", "c/1.pt")}
    cache.fetch(store, "a/1.pt", shas["a/1.pt"])
    cache.fetch(store, "b/1.pt", shas["b/1.pt"])
    past = time.time() - 60
    os.utime(cache.path_for("b/1.pt"), (past, past))  # b used longer ago than a
    cache.fetch(store, "c/1.pt", shas["c/1.pt"])  # 3000 bytes > 2500: one must go
    assert [k for k in shas if cache.path_for(k).exists()] == ["a/1.pt", "c/1.pt"]
    assert cache.size() <= 2500
