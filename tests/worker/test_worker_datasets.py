"""An s3:// data_root is allowed (a bucket, no .. parts), synced once into the node's cache
(objects under the prefix, atomically), and reused by later jobs without asking the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.artifacts import open_store
from services.data_roots import data_root_refusal
from services.settings import Settings
from services.worker.datasets import synced_data_root


def test_s3_data_roots_are_allowed_unless_malformed(tmp_path: Path) -> None:
    roots = [tmp_path]
    assert data_root_refusal("s3://datasets/mnist", roots) is None
    assert "s3://bucket/prefix" in (data_root_refusal("s3:///mnist", roots) or "")
    assert ".." in (data_root_refusal("s3://datasets/../secrets", roots) or "")


def test_an_s3_data_root_is_synced_once_into_the_node_cache(
    settings: Settings, s3_url: str, tmp_path: Path, s3_server: object
) -> None:
    store = open_store(s3_url)
    for key, data in (("raw/train.bin", b"t" * 1000), ("raw/test.bin", b"v" * 10), ("meta.json", b"{}")):
        source = tmp_path / "x"
        source.write_bytes(data)
        store.put(key, source)

    local = Path(synced_data_root(settings, s3_url))

    assert local.is_relative_to(settings.cache_path)
    files = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    assert files == ["meta.json", "raw/test.bin", "raw/train.bin"]
    assert (local / "raw" / "train.bin").read_bytes() == b"t" * 1000
    assert [p.name for p in local.parent.iterdir()] == [local.name]  # no temp directory left
    s3_server.stop()  # type: ignore[attr-defined]
    try:  # synced once: the next job on this node does not need the store
        assert synced_data_root(settings, s3_url) == str(local)
    finally:
        s3_server.start()  # type: ignore[attr-defined]


def test_an_empty_prefix_says_so(settings: Settings, s3_url: str) -> None:
    with pytest.raises(FileNotFoundError, match="holds no objects"):
        synced_data_root(settings, s3_url + "/nothing-here")
