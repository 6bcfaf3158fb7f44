"""StoreCallback batches metric writes off the training thread, and a checkpoint's row never
lands before the metrics of the steps it covers."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from accumcore import CheckpointInfo
from services.settings import Settings
from services.store import checkpoints, jobs, leases, metrics
from services.store.sessions import session_factory
from services.worker.callbacks import StoreCallback


def claimed_job(settings: Settings, make_job: Callable[..., str]) -> str:
    job_id = make_job()
    with session_factory(settings).begin() as session:
        assert leases.claim_job(session, job_id, "w1", "host", "cpu", lease_timeout_s=600)
    return job_id


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


def test_checkpoint_row_is_written_with_every_metric_up_to_its_step(
    settings: Settings, make_job: Callable[..., str], tmp_path: Path
) -> None:
    job_id = claimed_job(settings, make_job)
    sessions = session_factory(settings)
    callback = StoreCallback(sessions, job_id, 1, "w1", total_steps=9, keep_checkpoints=1,
                             flush_every_steps=1000, flush_every_s=60)
    callback.on_fit_start(None)
    files = []
    for step in range(1, 10):
        callback.on_step(None, step_metrics(step))
        if step % 3 == 0:
            path = tmp_path / f"{step}.pt"
            path.write_bytes(b"x")
            files.append(path)
            callback.on_checkpoint(None, CheckpointInfo(path, step, 0, 1, "0" * 64, {"loss": 1.0}))
            assert loss_steps(settings, job_id) == list(range(1, step + 1))
    callback.close()
    with sessions() as session:
        kept = [c.step for c in checkpoints.list_checkpoints(session, job_id)]
    assert kept == [9]  # keep_checkpoints=1, no val_loss: only the latest
    assert [p.exists() for p in files] == [False, False, True]
