"""A job's checkpoints through the artifact store, in-process, on a local directory and on S3:
rows hold keys and the objects are in the store (nothing in the node's local artifacts
directory with S3), a resume on another node fetches the checkpoint into that node's cache
(sha256 checked), and a checkpoint that cannot be read is a transient fault: a ``store_fault``
event, the attempt handed back with a restart counted, ``failed`` only once ``max_restarts``
is spent, with a message naming the store and the way back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from job_specs import TINY_SPEC
from sqlalchemy import select

from services.artifacts import open_store
from services.jobdb import checkpoints, events, jobs
from services.jobdb.models import JobAttempt, Owner
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker import runner
from services.worker.attempt import Outcome
from services.worker.runner import run_job

SPEC = {**TINY_SPEC, "max_steps": 4, "checkpoint_every": 2, "keep_checkpoints": 5}


@pytest.fixture
def store_settings_for(settings: Settings, artifacts_url: str) -> Settings:
    """The worker's settings with this test's store (local or S3)."""
    return settings.model_copy(update={"artifacts_url": artifacts_url})


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "FAULT_BACKOFF_S", 0.0)


def load(settings: Settings, job_id: str) -> Any:
    with session_factory(settings)() as session:
        return jobs.load_job(session, job_id)


def store_events(settings: Settings, job_id: str) -> list[Any]:
    with session_factory(settings)() as session:
        return [e for e in events.list_events(session, job_id) if e.kind == "store_fault"]


def attempt_rows(settings: Settings, job_id: str) -> list[tuple[str | None, int | None, int | None]]:
    """``(outcome, resume_step, end_step)`` of each of the job's attempts."""
    with session_factory(settings)() as session:
        rows = session.scalars(select(JobAttempt).where(JobAttempt.job_id == job_id)
                               .order_by(JobAttempt.attempt))
        return [(r.outcome, r.resume_step, r.end_step) for r in rows]


def fail_and_resume(settings: Settings, job_id: str) -> None:
    """Make the finished job resumable from its latest checkpoint (as POST /resume does)."""
    with session_factory(settings).begin() as session:
        job = jobs.load_job(session, job_id)
        job.status = "failed"
        jobs.request_resume(session, job)


def test_checkpoints_are_objects_in_the_store_and_rows_hold_keys(
    store_settings_for: Settings, make_job: Callable[..., str]
) -> None:
    settings = store_settings_for
    job_id = make_job(SPEC)
    assert run_job(settings, job_id, "node-a") == "succeeded"
    with session_factory(settings)() as session:
        rows = checkpoints.list_checkpoints(session, job_id)
    assert [(c.step, c.key) for c in rows] == [(2, f"{job_id}/2.pt"), (4, f"{job_id}/4.pt")]
    store = open_store(settings.artifacts_url)
    assert [o.key for o in store.list(f"{job_id}/")] == [c.key for c in rows]
    if settings.artifacts_on_s3:
        assert not settings.artifacts_path.exists()  # nothing on the node's disk but its cache
    assert list((settings.cache_path / "staging").rglob("*.pt")) == []  # all uploaded


def test_a_resume_on_another_node_fetches_the_checkpoint_into_its_cache(
    store_settings_for: Settings, make_job: Callable[..., str], tmp_path: Path
) -> None:
    job_id = make_job(SPEC)
    assert run_job(store_settings_for, job_id, "node-a") == "succeeded"
    fail_and_resume(store_settings_for, job_id)
    other = store_settings_for.model_copy(update={"cache_dir": tmp_path / "node-b-cache"})
    assert run_job(other, job_id, "node-b") == "succeeded"
    job = load(other, job_id)
    assert job.attempts == 2 and job.progress["optimizer_step"] == 4
    assert (tmp_path / "node-b-cache" / "objects" / job_id / "4.pt").is_file()


def test_a_missing_checkpoint_object_is_a_transient_fault_then_a_clear_failure(
    store_settings_for: Settings, make_job: Callable[..., str], tmp_path: Path
) -> None:
    settings = store_settings_for
    job_id = make_job(SPEC)
    assert run_job(settings, job_id, "node-a") == "succeeded"
    open_store(settings.artifacts_url).delete(f"{job_id}/4.pt")
    fail_and_resume(settings, job_id)
    other = settings.model_copy(update={"cache_dir": tmp_path / "cold"})  # not cached there

    assert run_job(other, job_id, "node-b") == Outcome.HANDED_BACK  # a restart counted
    job = load(other, job_id)
    assert (job.status, job.restarts, job.resume_step) == ("queued", 1, 4)
    (fault,) = store_events(other, job_id)
    assert f"{job_id}/4.pt" in fault.message and settings.artifacts_url in fault.message

    for _ in range(job.max_restarts - 1):
        assert run_job(other, job_id, "node-b") == Outcome.HANDED_BACK
    assert run_job(other, job_id, "node-b") == "failed"  # max_restarts is spent
    job = load(other, job_id)
    assert job.error["type"] == "ArtifactStoreError"
    assert settings.artifacts_url in job.error["message"]
    assert "--from-step" in job.error["message"]  # and how to come back
    assert len(store_events(other, job_id)) == job.max_restarts + 1
    # Every attempt is closed: the faulted ones trained nothing (each failed to fetch step 4).
    assert attempt_rows(other, job_id) == [("succeeded", None, 4)] + [
        ("store_fault", 4, 4)] * job.max_restarts + [("failed", 4, 4)]


def test_a_cancel_during_the_fault_back_off_ends_the_job_cancelled(
    store_settings_for: Settings, make_job: Callable[..., str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancel that arrives while the faulted attempt backs off: not handed back, not left
    ``cancelling`` for the reaper with its attempt open, but cancelled by its worker."""
    settings = store_settings_for
    job_id = make_job(SPEC)
    assert run_job(settings, job_id, "node-a") == "succeeded"
    open_store(settings.artifacts_url).delete(f"{job_id}/4.pt")
    fail_and_resume(settings, job_id)

    def cancel_meanwhile(*_: Any) -> None:
        with session_factory(settings).begin() as session:
            jobs.request_cancel(session, jobs.load_job(session, job_id))

    monkeypatch.setattr(runner, "back_off", cancel_meanwhile)
    other = settings.model_copy(update={"cache_dir": tmp_path / "cold"})
    assert run_job(other, job_id, "node-b") == Outcome.CANCELLED
    job = load(other, job_id)
    assert (job.status, job.lease_owner) == ("cancelled", None)
    assert attempt_rows(other, job_id) == [("succeeded", None, 4), ("cancelled", 4, 4)]


def test_a_damaged_cached_copy_is_fetched_again(
    store_settings_for: Settings, make_job: Callable[..., str]
) -> None:
    settings = store_settings_for
    job_id = make_job(SPEC)
    assert run_job(settings, job_id, "node-a") == "succeeded"
    cached = settings.cache_path / "objects" / job_id / "4.pt"
    cached.write_bytes(b"bit rot")
    fail_and_resume(settings, job_id)
    assert run_job(settings, job_id, "node-a") == "succeeded"
    assert store_events(settings, job_id) == []


def test_at_the_owner_quota_the_next_checkpoint_is_not_written_and_the_job_fails(
    store_settings_for: Settings, make_job: Callable[..., str]
) -> None:
    first = make_job(SPEC)
    assert run_job(store_settings_for, first, "node-a") == "succeeded"
    with session_factory(store_settings_for)() as session:
        used = sum(c.size_bytes for c in checkpoints.list_checkpoints(session, first))
    # Room for what the owner has plus one more checkpoint, not two.
    settings = store_settings_for.model_copy(
        update={"max_artifact_bytes_per_owner": used + used // 2 + 1})
    with session_factory(settings).begin() as session:
        owner = session.get(Owner, jobs.load_job(session, first).owner_id)
        second, _ = jobs.create_job(session, owner=owner, spec=SPEC, queue="default")
        second_id = second.id
    assert run_job(settings, second_id, "node-a") == "failed"
    job = load(settings, second_id)
    assert "ACCUM_MAX_ARTIFACT_BYTES_PER_OWNER" in job.error["message"]
    assert "accum delete" in job.error["message"]
    with session_factory(settings)() as session:
        kinds = [e.kind for e in events.list_events(session, second_id)]
        stored = [c.step for c in checkpoints.list_checkpoints(session, second_id)]
    assert "artifact_quota" in kinds and stored == [2]  # the first fitted, the second did not
    assert [o.key for o in open_store(settings.artifacts_url).list(f"{second_id}/")] == [
        f"{second_id}/2.pt"]
