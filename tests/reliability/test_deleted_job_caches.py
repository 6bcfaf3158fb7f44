"""A deleted job does not live on in node caches: after `DELETE /v1/jobs/{id}` the worker that
cached its checkpoints drops them on its next heartbeat (a kept job's stay), and a cached file
of a job deleted in between is never served."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from worker_stack import Stack

from services.api.main import create_app
from services.artifacts import ObjectMissing, open_store
from services.jobdb import tokens
from services.settings import Settings
from services.worker.checkpoints.stores import node_cache

pytestmark = pytest.mark.slow


def test_a_deleted_jobs_cached_checkpoints_leave_the_node(
    stack: Stack, tmp_path: Path, record_figure: Callable[..., None]
) -> None:
    own = stack.variant(tmp_path)
    cache = tmp_path / "node" / "cache"
    own.start_worker(ACCUM_HOME=str(tmp_path / "node"), ACCUM_CACHE_DIR=str(cache))
    try:
        deleted, kept = own.create(), own.create()
        for job_id in (deleted, kept):
            job = own.wait(job_id, timeout=120)
            assert job.status == "succeeded", (job.error, own.worker_logs())
        # The uploads were adopted into the node's cache (a resume here would be warm).
        assert list((cache / "objects" / deleted).glob("*.pt")) and list((cache / "objects" / kept).glob("*.pt"))
        with own.sessions.begin() as session:
            _, token = tokens.create_owner_with_token(session, f"admin-{deleted[-6:]}", admin=True)
        api = create_app(own.settings.model_copy(update={"home": tmp_path / "api"}), run_reaper=False)
        with TestClient(api) as client:
            response = client.delete(f"/v1/jobs/{deleted}", headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 204, response.text
        started = time.monotonic()
        while (cache / "objects" / deleted).exists() and time.monotonic() - started < 30:
            time.sleep(0.05)
        dropped_after_s = time.monotonic() - started
        assert not (cache / "objects" / deleted).exists(), own.worker_logs()
        assert list((cache / "objects" / kept).glob("*.pt"))  # a job that still exists keeps its files
    finally:
        own.stop_workers()
    record_figure(
        "deleted_job_node_cache",
        area="fault",
        check="DELETE a finished job whose checkpoints a worker node cached (heartbeat "
              f"{own.settings.heartbeat_interval_s:g} s); a kept job beside it",
        figure=f"the deleted job's cached checkpoints gone from the node {dropped_after_s:.1f} s after "
               "the DELETE; the kept job's stay",
        passed=True,
    )


def test_a_cached_file_of_a_deleted_job_is_not_served(store_settings: Settings, tmp_path: Path) -> None:
    settings = store_settings.model_copy(update={"cache_dir": tmp_path / "cache"})
    cache = node_cache(settings)
    staged = tmp_path / "1.pt"
    staged.write_bytes(b"weights of a job deleted since its row was read")
    cached = cache.adopt("gone-job/1.pt", staged)
    store = open_store((tmp_path / "store").as_uri())  # empty: nothing may come from it either
    with pytest.raises(ObjectMissing, match="gone-job was deleted"):
        cache.fetch(store, "gone-job/1.pt", "0" * 64)
    assert not cached.exists() and not cached.parent.exists()
