"""StoreCallback batches metric writes off the training thread; a checkpoint is uploaded to the
artifact store (local and S3) behind training and its row lands once the object is complete,
never before the metrics of the steps it covers; pruned checkpoints leave the store."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from accumcore import CheckpointInfo
from services.artifacts import ArtifactStoreError, ObjectInfo, StoreUnavailable, open_store
from services.artifacts.cache import NodeCache
from services.jobdb import checkpoints, jobs, leases, metrics
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker.callbacks import StoreCallback
from services.worker.checkpoints.uploads import CheckpointUploads


def claimed_job(settings: Settings, make_job: Callable[..., str]) -> str:
    job_id = make_job()
    with session_factory(settings).begin() as session:
        assert leases.claim_job(session, job_id, "w1", "host", "cpu", lease_timeout_s=600)
    return job_id


def uploads_for(settings: Settings, job_id: str, url: str | None = None) -> CheckpointUploads:
    store = open_store(url or settings.artifacts_url)
    return CheckpointUploads(store, NodeCache(settings.cache_path, 10**9), job_id, retry_for_s=5)


def step_metrics(step: int) -> dict[str, float]:
    return {"step": float(step), "epoch": 0.0, "loss": 1.0 / step, "lr": 0.1, "grad_norm": 1.0}


def loss_steps(settings: Settings, job_id: str) -> list[int]:
    with session_factory(settings)() as session:
        rows, _ = metrics.read_metrics(session, job_id, name="loss", limit=10_000)
    return [r.step for r in rows]


def test_steps_are_written_in_batches_by_the_writer_thread(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = claimed_job(settings, make_job)
    sessions = session_factory(settings)
    callback = StoreCallback(sessions, job_id, 1, "w1", total_steps=250, keep_checkpoints=2,
                             uploads=uploads_for(settings, job_id),
                             flush_every_steps=100, flush_every_s=60)
    callback.on_fit_start(None)
    for step in range(1, 251):
        callback.on_step(None, step_metrics(step))
    deadline = time.monotonic() + 10
    while len(loss_steps(settings, job_id)) < 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(loss_steps(settings, job_id)) >= 200  # written without any call from training
    callback.on_fit_end(None, None)
    assert loss_steps(settings, job_id) == list(range(1, 251))
    assert callback.flushes <= 4  # a handful of transactions, not one per step
    with sessions() as session:
        job = jobs.load_job(session, job_id)
    assert job is not None and job.progress["optimizer_step"] == 250
    assert job.latest_metrics["loss"] == 1.0 / 250


def stage(uploads: CheckpointUploads, step: int) -> CheckpointInfo:
    """A checkpoint file the trainer would have written into the staging directory."""
    path = uploads.staging_dir / f"{step}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = f"checkpoint {step}".encode() * 1000
    path.write_bytes(data)
    return CheckpointInfo(path, step, 0, len(data), hashlib.sha256(data).hexdigest(), {"loss": 1.0})


def test_checkpoint_row_is_written_with_every_metric_up_to_its_step(
    settings: Settings, make_job: Callable[..., str], artifacts_url: str
) -> None:
    job_id = claimed_job(settings, make_job)
    sessions = session_factory(settings)
    uploads = uploads_for(settings, job_id, artifacts_url)
    callback = StoreCallback(sessions, job_id, 1, "w1", total_steps=9, keep_checkpoints=1,
                             uploads=uploads, flush_every_steps=1000, flush_every_s=60)
    callback.on_fit_start(None)
    for step in range(1, 10):
        callback.on_step(None, step_metrics(step))
        if step % 3 == 0:
            callback.on_checkpoint(None, stage(uploads, step))
            uploads.wait()
            assert loss_steps(settings, job_id) == list(range(1, step + 1))
    callback.close()
    with sessions() as session:
        kept = checkpoints.list_checkpoints(session, job_id)
    assert [c.step for c in kept] == [9]  # keep_checkpoints=1, no val_loss: only the latest
    assert kept[0].key == f"{job_id}/9.pt"  # a key in the store, not a node's path
    assert [o.key for o in uploads.store.list(f"{job_id}/")] == [f"{job_id}/9.pt"]
    # Each staged file moved into the node cache once uploaded; pruned ones left it too.
    assert list(uploads.staging_dir.iterdir()) == []
    assert uploads.cache.path_for(f"{job_id}/9.pt").is_file()
    assert not uploads.cache.path_for(f"{job_id}/6.pt").exists()


class SlowStore:
    """A store whose puts wait for the test's go-ahead: an upload in flight, held."""

    def __init__(self, inner: object, fail: bool = False) -> None:
        import threading

        self.inner, self.fail = inner, fail
        self.url = getattr(inner, "url", "")
        self.release = threading.Event()
        self.puts: list[str] = []

    def put(self, key: str, source: Path, sha256: str | None = None, *, size: int | None = None) -> ObjectInfo:
        self.puts.append(key)
        self.release.wait(10)
        if self.fail:
            raise StoreUnavailable(f"cannot upload {key} at {self.url}: connection refused")
        return self.inner.put(key, source, sha256, size=size)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_the_row_waits_for_the_upload_and_one_upload_is_in_flight_at_a_time(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = claimed_job(settings, make_job)
    sessions = session_factory(settings)
    uploads = uploads_for(settings, job_id)
    slow = SlowStore(uploads.store)
    uploads.store = slow  # type: ignore[assignment]
    callback = StoreCallback(sessions, job_id, 1, "w1", total_steps=4, keep_checkpoints=5,
                             uploads=uploads, flush_every_steps=1000, flush_every_s=60)
    callback.on_fit_start(None)
    callback.on_step(None, step_metrics(1))
    callback.on_checkpoint(None, stage(uploads, 1))  # returns at once: training goes on
    deadline = time.monotonic() + 5
    while not slow.puts and time.monotonic() < deadline:
        time.sleep(0.01)
    with sessions() as session:
        assert checkpoints.list_checkpoints(session, job_id) == []  # not complete: no row
    import threading

    second = threading.Thread(target=callback.on_checkpoint, args=(None, stage(uploads, 2)))
    second.start()
    second.join(0.3)
    assert second.is_alive() and slow.puts == [f"{job_id}/1.pt"]  # waits for the first
    slow.release.set()
    second.join(10)
    callback.close()
    with sessions() as session:
        assert [c.step for c in checkpoints.list_checkpoints(session, job_id)] == [1, 2]


def test_a_failed_upload_writes_no_row_and_is_raised(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = claimed_job(settings, make_job)
    sessions = session_factory(settings)
    uploads = uploads_for(settings, job_id)
    uploads.retry_for_s = 0.3
    failing = SlowStore(uploads.store, fail=True)
    failing.release.set()
    uploads.store = failing  # type: ignore[assignment]
    callback = StoreCallback(sessions, job_id, 1, "w1", total_steps=1, keep_checkpoints=5,
                             uploads=uploads, flush_every_steps=1000, flush_every_s=60)
    callback.on_fit_start(None)
    callback.on_checkpoint(None, stage(uploads, 1))
    with pytest.raises(ArtifactStoreError, match="connection refused"):
        callback.close()
    assert len(failing.puts) > 1  # retried while the store was down
    with sessions() as session:
        assert checkpoints.list_checkpoints(session, job_id) == []
