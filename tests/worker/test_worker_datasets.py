"""An s3:// data_root is allowed when ACCUM_DATA_ROOTS lists its bucket and prefix (no ..
parts), checked before the store is asked anything, synced once into the node's cache
(objects under the prefix, atomically), and reused by later jobs without asking the store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from job_specs import TINY_SPEC

from services.artifacts import open_store
from services.data_roots import DataRootNotAllowed, allowed_data_roots, data_root_refusal
from services.jobdb.events import list_events
from services.jobdb.jobs import load_job
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker.datasets import named_as_synced, synced_data_root
from services.worker.runner import run_job


def test_an_s3_data_root_is_allowed_under_a_listed_s3_root_only(tmp_path: Path) -> None:
    roots = [tmp_path, "s3://datasets/public"]
    assert data_root_refusal("s3://datasets/public/mnist", roots) is None
    assert data_root_refusal("s3://datasets/public", roots) is None
    for outside in ("s3://datasets/public-v2/mnist", "s3://datasets/private", "s3://other/public/mnist"):
        assert "outside the allowed data roots" in (data_root_refusal(outside, roots) or ""), outside
    assert "outside the allowed data roots" in (data_root_refusal("s3://datasets/public", [tmp_path]) or "")
    assert "s3://bucket/prefix" in (data_root_refusal("s3:///mnist", roots) or "")
    assert ".." in (data_root_refusal("s3://datasets/public/../secrets", roots) or "")


def test_accum_data_roots_keeps_s3_entries_as_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCUM_DATA_ROOTS", f'["{tmp_path}", "s3://datasets/public/"]')
    roots = allowed_data_roots(Settings(home=tmp_path))
    assert roots == [tmp_path.resolve(), "s3://datasets/public"]  # not Path's "s3:/datasets/public"
    assert data_root_refusal("s3://datasets/public/mnist", roots) is None
    monkeypatch.setenv("ACCUM_DATA_ROOTS", '["s3:///public"]')
    with pytest.raises(ValueError, match="names no bucket; use s3://bucket/prefix"):
        Settings(home=tmp_path)


def test_the_roots_are_named_to_admins_only(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to("/etc")
    roots = [tmp_path / "allowed", "s3://datasets/public"]
    for refused in ("s3://checkpoints/alice", str(tmp_path / "link")):
        owner_view = data_root_refusal(refused, roots, show_roots=False) or ""
        assert "outside the allowed data roots" in owner_view
        assert "s3://datasets/public" not in owner_view and "/etc" not in owner_view
        assert str(tmp_path / "allowed") not in owner_view
        assert "s3://datasets/public" in (data_root_refusal(refused, roots) or "")


def test_an_unlisted_bucket_is_refused_before_the_store_is_asked(
    settings: Settings, s3_url: str, s3_server: object
) -> None:
    listed = settings.model_copy(update={"data_roots": [f"{s3_url}/data"]})
    s3_server.stop()  # type: ignore[attr-defined]
    try:  # refused, not StoreUnavailable: the check came before any request
        with pytest.raises(DataRootNotAllowed, match="outside the allowed data roots") as refused:
            synced_data_root(listed, f"{s3_url}/checkpoints")
    finally:
        s3_server.start()  # type: ignore[attr-defined]
    assert str(settings.cache_path) not in str(refused.value) and s3_url + "/data" not in str(refused.value)
    assert not (settings.cache_path / "data").exists()


def test_an_s3_data_root_is_synced_once_into_the_node_cache(
    settings: Settings, s3_url: str, tmp_path: Path, s3_server: object
) -> None:
    store = open_store(s3_url)
    for key, data in (("raw/train.bin", b"t" * 1000), ("raw/test.bin", b"v" * 10), ("meta.json", b"{}")):
        source = tmp_path / "x"
        source.write_bytes(data)
        store.put(key, source)

    settings = settings.model_copy(update={"data_roots": [s3_url]})
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
    settings = settings.model_copy(update={"data_roots": [s3_url]})
    with pytest.raises(FileNotFoundError, match="holds no objects"):
        synced_data_root(settings, s3_url + "/nothing-here")


def test_a_failure_on_the_synced_copy_names_the_s3_root_not_the_cache(
    settings: Settings, s3_url: str, tmp_path: Path, make_job: Callable[..., str]
) -> None:
    source = tmp_path / "notes.txt"
    source.write_text("no class folders here")
    open_store(s3_url).put("notes.txt", source)
    settings = settings.model_copy(update={"data_roots": [s3_url]})
    job_id = make_job({**TINY_SPEC, "model": "small_cnn",
                       "dataset": {"name": "imagefolder", "data_root": s3_url, "image_size": 16}})

    assert run_job(settings, job_id, "s3-worker") == "failed"

    with session_factory(settings)() as session:
        job = load_job(session, job_id)
        assert job is not None and job.error is not None
        shown = [job.error["message"], *(str(e.data) for e in list_events(session, job_id, limit=100)
                                         if e.kind == "traceback")]
    assert len(shown) == 2 and s3_url in shown[0]  # the owner's own root, as given
    for text in shown:
        assert str(settings.cache_path) not in text, text


def test_job_visible_text_names_the_workers_own_paths_as_the_owner_may_read_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42 item 4: a worker run as root outside Docker put /root/.cache/... in job errors."""
    monkeypatch.setenv("HOME", str(tmp_path / "root"))
    settings = Settings(home=tmp_path / "home")
    text = (f"OSError: {tmp_path}/root/.cache/huggingface/hub/models--x not found; "
            f"no file {settings.cache_path}/data/datasets/mnist/x.csv")
    assert named_as_synced(settings, text) == (
        "OSError: ~/.cache/huggingface/hub/models--x not found; no file s3://datasets/mnist/x.csv")
