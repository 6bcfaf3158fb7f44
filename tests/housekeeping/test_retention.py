"""ACCUM_RETENTION_DAYS deletes the checkpoints (objects, then rows) of jobs finished longer
ago, except each job's final and best one; recent and unfinished jobs keep theirs. On a local
directory and on S3."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from services.artifacts import open_store
from services.housekeeping.retention import sweep_retention
from services.jobdb import checkpoints, jobs
from services.jobdb.sessions import session_factory
from services.jobdb.types import utcnow
from services.settings import Settings


def job_with_checkpoints(settings: Settings, make_job: Callable[..., str], tmp_path: Path,
                         status: str, finished_days_ago: float | None) -> str:
    job_id = make_job()
    store = open_store(settings.artifacts_url)
    source = tmp_path / "c.pt"
    source.write_bytes(b"c" * 100)
    with session_factory(settings).begin() as session:
        for step, val_loss in ((10, 0.2), (20, 0.5), (30, 0.7), (40, 0.9)):
            store.put(f"{job_id}/{step}.pt", source)
            checkpoints.add_checkpoint(session, job_id, step, f"{job_id}/{step}.pt", 100, "0" * 64,
                                       metrics={"val_loss": val_loss})
        job = jobs.load_job(session, job_id)
        job.status = status
        if finished_days_ago is not None:
            job.finished_at = utcnow() - timedelta(days=finished_days_ago)
    return job_id


def kept(settings: Settings, job_id: str) -> tuple[list[int], list[str]]:
    with session_factory(settings)() as session:
        rows = [c.step for c in checkpoints.list_checkpoints(session, job_id)]
    return rows, [o.key.split("/")[1] for o in open_store(settings.artifacts_url).list(f"{job_id}/")]


def test_old_finished_jobs_keep_only_their_final_and_best_checkpoints(
    settings: Settings, make_job: Callable[..., str], artifacts_url: str, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"artifacts_url": artifacts_url, "retention_days": 7})
    old = job_with_checkpoints(settings, make_job, tmp_path, "succeeded", finished_days_ago=8)
    recent = job_with_checkpoints(settings, make_job, tmp_path, "failed", finished_days_ago=1)
    running = job_with_checkpoints(settings, make_job, tmp_path, "running", finished_days_ago=None)

    deleted = sweep_retention(settings, force=True)

    assert sorted(deleted) == [f"{old}/20.pt", f"{old}/30.pt"]
    assert kept(settings, old) == ([10, 40], ["10.pt", "40.pt"])  # best (0.2) and final
    assert kept(settings, recent)[0] == [10, 20, 30, 40]
    assert kept(settings, running)[0] == [10, 20, 30, 40]
    assert sweep_retention(settings, force=True) == []  # nothing more to do


def test_retention_is_off_by_default(settings: Settings, make_job: Callable[..., str],
                                     tmp_path: Path) -> None:
    old = job_with_checkpoints(settings, make_job, tmp_path, "succeeded", finished_days_ago=800)
    assert sweep_retention(settings, force=True) == []
    assert kept(settings, old)[0] == [10, 20, 30, 40]
