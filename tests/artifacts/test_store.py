"""The artifact store, on a local directory and on S3 (moto server): put is complete and
verified before it returns, get checks the sha256, ranged reads, list, delete, presign."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx
import pytest

from services.artifacts import (
    ChecksumMismatch,
    LocalStore,
    ObjectMissing,
    StoreUnavailable,
    open_store,
    sha256_of,
)
from services.artifacts.base import CHUNK_BYTES


def write(path: Path, size: int, seed: int = 0) -> str:
    data = (hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1))[:size]
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def test_put_get_roundtrip_of_a_multipart_object(artifacts_url: str, tmp_path: Path) -> None:
    store = open_store(artifacts_url)
    source = tmp_path / "ckpt.pt"
    size = 2 * CHUNK_BYTES + 12345  # three parts on S3
    sha = write(source, size)
    info = store.put("job1/10.pt", source, sha)
    assert (info.key, info.size, info.sha256) == ("job1/10.pt", size, sha)
    assert store.head("job1/10.pt") is not None and store.head("job1/10.pt").size == size  # type: ignore[union-attr]
    fetched = store.get("job1/10.pt", tmp_path / "out" / "10.pt", sha)
    assert fetched.sha256 == sha and sha256_of(tmp_path / "out" / "10.pt") == (sha, size)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["10.pt"]  # no temp file left


def test_a_put_given_its_writers_sha256_and_size_stores_the_file_as_is(
    artifacts_url: str, tmp_path: Path
) -> None:
    store = open_store(artifacts_url)
    source = tmp_path / "known.pt"
    size = CHUNK_BYTES + 999  # multipart on S3
    sha = write(source, size, seed=4)
    info = store.put("job2/5.pt", source, sha, size=size)
    assert (info.key, info.size, info.sha256) == ("job2/5.pt", size, sha)
    assert store.get("job2/5.pt", tmp_path / "back.pt", sha).sha256 == sha  # the same bytes


def test_a_put_refuses_a_file_whose_size_is_not_its_writers(artifacts_url: str, tmp_path: Path) -> None:
    store = open_store(artifacts_url)
    source = tmp_path / "cut.pt"
    sha = write(source, 1000)
    with pytest.raises(ChecksumMismatch, match="1000 bytes but its writer recorded 2000"):
        store.put("j/cut.pt", source, sha, size=2000)
    assert store.list("j/") == []


def test_a_local_put_makes_its_copy_and_its_name_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's staged file is not fsynced: the file store's copy must be, then its
    directory (the rename), before put returns."""
    store = LocalStore(tmp_path / "store")
    source = tmp_path / "staged.pt"
    sha = write(source, 5000)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.put("job3/1.pt", source, sha, size=5000)
    folder = tmp_path / "store" / "job3"
    assert len(synced) == 2 and Path(synced[0]).parent == folder and Path(synced[1]) == folder
    assert Path(synced[0]).name.endswith(".tmp")  # the temp file, before its rename


def test_range_reads(artifacts_url: str, tmp_path: Path) -> None:
    store = open_store(artifacts_url)
    source = tmp_path / "a.pt"
    write(source, 100_000, seed=1)
    data = source.read_bytes()
    store.put("j/a.pt", source)
    assert b"".join(store.open("j/a.pt")) == data
    assert b"".join(store.open("j/a.pt", 10, 20)) == data[10:20]
    assert b"".join(store.open("j/a.pt", 99_990)) == data[99_990:]


def test_a_wrong_sha256_leaves_no_object(artifacts_url: str, tmp_path: Path) -> None:
    store = open_store(artifacts_url)
    source = tmp_path / "b.pt"
    write(source, 1000)
    with pytest.raises(ChecksumMismatch, match="sha256"):
        store.put("j/b.pt", source, "0" * 64)
    assert store.head("j/b.pt") is None
    assert store.list("j/") == []


def test_get_refuses_bytes_with_another_sha256(artifacts_url: str, tmp_path: Path) -> None:
    store = open_store(artifacts_url)
    source = tmp_path / "c.pt"
    write(source, 1000)
    store.put("j/c.pt", source)
    with pytest.raises(ChecksumMismatch, match="j/c.pt"):
        store.get("j/c.pt", tmp_path / "got.pt", "f" * 64)
    assert not (tmp_path / "got.pt").exists()


def test_list_delete_and_missing_objects(artifacts_url: str, tmp_path: Path) -> None:
    store = open_store(artifacts_url)
    source = tmp_path / "d.pt"
    write(source, 10)
    for key in ("j1/1.pt", "j1/2.pt", "j10/1.pt"):
        store.put(key, source)
    assert [o.key for o in store.list("j1/")] == ["j1/1.pt", "j1/2.pt"]
    assert [o.key for o in store.list()] == ["j1/1.pt", "j1/2.pt", "j10/1.pt"]
    store.delete("j1/1.pt")
    store.delete("j1/1.pt")  # twice: not an error
    assert [o.key for o in store.list("j1/")] == ["j1/2.pt"]
    with pytest.raises(ObjectMissing, match="j1/1.pt"):
        store.get("j1/1.pt", tmp_path / "x.pt")
    with pytest.raises(ValueError, match="relative path"):
        store.head("../etc/passwd")


def test_presign_gives_a_url_anyone_can_get_on_s3_only(artifacts_url: str, tmp_path: Path) -> None:
    store = open_store(artifacts_url)
    source = tmp_path / "e.pt"
    sha = write(source, 5000)
    store.put("j/e.pt", source)
    url = store.presign("j/e.pt", 60)
    if isinstance(store, LocalStore):
        assert url is None
        return
    assert url is not None
    response = httpx.get(url)  # no credentials: the signature is the permission
    assert response.status_code == 200 and hashlib.sha256(response.content).hexdigest() == sha


def test_the_region_comes_from_the_environment(s3_url: str) -> None:
    # The fixture's bucket lives in eu-west-3 (not the us-east-1 default).
    assert os.environ["AWS_REGION"] == "eu-west-3"
    assert open_store(s3_url).list() == []


def test_an_unreachable_store_says_which_and_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from services.ports import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    store = open_store("s3://nowhere/prefix")
    source = tmp_path / "f.pt"
    write(source, 10)
    with pytest.raises(StoreUnavailable, match="s3://nowhere/prefix"):
        store.put("j/f.pt", source)


def test_open_store_refuses_unknown_schemes() -> None:
    with pytest.raises(ValueError, match="file, s3"):
        open_store("gs://bucket/x")
