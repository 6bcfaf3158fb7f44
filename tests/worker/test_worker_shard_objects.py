"""A sharded checkpoint's objects (``<job>/<step>/...``) in a real local store: pruning deletes
every object of the step's folder and the node cache's copies; the orphan sweep removes the
folders of steps no row lists and leaves listed ones, ``<step>.pt`` files and other objects."""

from __future__ import annotations

from pathlib import Path

from services.artifacts import LocalStore, manifest_key
from services.artifacts.cache import NodeCache
from services.worker.checkpoints.orphans import orphans, remove_orphans
from services.worker.checkpoints.uploads import CheckpointUploads

JOB = "job-1"
FILES = (".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.pt", "consolidated.pt", "manifest.json")


def put(store: LocalStore, tmp_path: Path, key: str) -> None:
    source = tmp_path / "source"
    source.write_bytes(key.encode())
    store.put(key, source)


def sharded(store: LocalStore, tmp_path: Path, step: int) -> list[str]:
    keys = [f"{JOB}/{step}/{name}" for name in FILES]
    for key in keys:
        put(store, tmp_path, key)
    return keys


def test_pruning_a_sharded_checkpoint_deletes_its_whole_folder_and_cached_copies(tmp_path: Path) -> None:
    store, cache = LocalStore(tmp_path / "store"), NodeCache(tmp_path / "cache", 1 << 20)
    pruned, kept = sharded(store, tmp_path, 5), sharded(store, tmp_path, 10)
    cached = cache.path_for(pruned[1])
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"shard")
    CheckpointUploads(store, cache, JOB, retry_for_s=1).delete([manifest_key(JOB, 5)])
    assert [o.key for o in store.list(f"{JOB}/")] == sorted(kept)
    assert not cached.parent.exists()


def test_the_orphan_sweep_removes_unlisted_steps_folders_only(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    orphan, listed = sharded(store, tmp_path, 5), sharded(store, tmp_path, 10)
    for key in (f"{JOB}/7.pt", f"{JOB}/10.pt", f"{JOB}/tensorboard/events.out"):
        put(store, tmp_path, key)
    assert sorted(orphans(store, JOB, [10])) == sorted([*orphan, f"{JOB}/7.pt"])
    remove_orphans(store, JOB, [10])
    left = sorted(o.key for o in store.list(f"{JOB}/"))
    assert left == sorted([*listed, f"{JOB}/10.pt", f"{JOB}/tensorboard/events.out"])
