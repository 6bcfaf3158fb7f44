"""A job's checkpoint objects are brought back in line with its rows before an attempt trains:
objects no row lists (a predecessor killed between upload and row) and a local store's temp
files (killed mid-put) go; listed checkpoints, other jobs' and unrelated objects stay. On a
local directory and on S3."""

from __future__ import annotations

from pathlib import Path

from services.artifacts import open_store
from services.worker.checkpoints.orphans import orphans, remove_orphans


def test_unlisted_objects_are_removed_listed_ones_kept(artifacts_url: str, tmp_path: Path) -> None:
    store = open_store(artifacts_url)
    source = tmp_path / "x"
    source.write_bytes(b"x")
    for key in ("j/10.pt", "j/20.pt", "j/30.pt", "j/notes.txt", "j/best.pt", "j2/30.pt"):
        store.put(key, source)
    assert orphans(store, "j", [10, 20]) == ["j/30.pt"]
    assert remove_orphans(store, "j", [10, 20]) == ["j/30.pt"]
    assert [o.key for o in store.list()] == [
        "j/10.pt", "j/20.pt", "j/best.pt", "j/notes.txt", "j2/30.pt"]


def test_a_local_stores_temp_files_go_too(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    (tmp_path / "store" / "j").mkdir(parents=True)
    temp = tmp_path / "store" / "j" / ".40.pt.x1y2.tmp"
    temp.write_bytes(b"partial")
    assert remove_orphans(store, "j", []) == []
    assert not temp.exists()


def test_a_job_without_objects_has_no_orphans(artifacts_url: str) -> None:
    assert remove_orphans(open_store(artifacts_url), "never-written", [5]) == []
