"""The runner in-process: what it records and the ``Outcome`` it returns for dropped messages,
failures, a normal run, a hand-back and a lost lease."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from job_specs import TINY_SPEC

from services.dispatch.enqueue import celery_app_for
from services.jobdb import checkpoints, events, jobs, metrics
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker import rank, shutdown
from services.worker.attempt import Outcome
from services.worker.runner import run_job


def load(settings: Settings, job_id: str) -> Any:
    with session_factory(settings)() as session:
        return jobs.load_job(session, job_id)


def kinds(settings: Settings, job_id: str) -> list[str]:
    with session_factory(settings)() as session:
        return [e.kind for e in events.list_events(session, job_id)]


def test_a_cancelled_job_is_not_claimed_and_the_message_is_dropped(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job()
    with session_factory(settings).begin() as session:
        jobs.request_cancel(session, jobs.load_job(session, job_id))
    assert run_job(settings, job_id, "w") == Outcome.SKIPPED
    job = load(settings, job_id)
    assert job.status == "cancelled" and job.attempts == 0


def test_an_invalid_stored_spec_fails_with_the_validation_error(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job({**TINY_SPEC, "micro_batch_size": 0})
    assert run_job(settings, job_id, "w") == Outcome.FAILED
    job = load(settings, job_id)
    assert job.status == "failed" and job.error["type"] == "ValidationError"
    assert "micro_batch_size" in job.error["message"]
    assert kinds(settings, job_id)[-2:] == ["traceback", "failed"]


def test_an_exception_in_training_fails_the_job_once_with_its_traceback(
    settings: Settings, make_job: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("loss exploded at step 3")

    monkeypatch.setattr(rank, "build_run", explode)
    job_id = make_job()
    assert run_job(settings, job_id, "w") == "failed"
    job = load(settings, job_id)
    assert job.error == {"type": "RuntimeError", "message": "loss exploded at step 3"}
    with session_factory(settings)() as session:
        trace = [e for e in events.list_events(session, job_id) if e.kind == "traceback"]
    assert len(trace) == 1 and "explode" in trace[0].data["traceback"]
    assert run_job(settings, job_id, "w") == Outcome.SKIPPED  # a redelivery does not run it again


def test_a_run_writes_progress_metrics_and_a_final_checkpoint(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job({**TINY_SPEC, "max_steps": 3})
    assert run_job(settings, job_id, "worker-a") == "succeeded"
    job = load(settings, job_id)
    assert job.progress == {"epoch": 0, "optimizer_step": 3, "total_optimizer_steps": 3}
    assert job.worker_host and job.worker_gpu == "cpu" and job.lease_owner is None
    with session_factory(settings)() as session:
        rows, _ = metrics.read_metrics(session, job_id, name="loss")
    assert [r.step for r in rows] == [1, 2, 3]
    assert (settings.artifacts_path / job_id / "3.pt").is_file()


def test_checkpoint_epoch_is_the_0_based_epoch_of_its_step_like_metrics(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    """The final checkpoint of a one-epoch run is in epoch 0, the epoch its step's metrics
    carry (the trainer's counter has moved on to epoch 1 when it saves at the epoch's end)."""
    spec = {**TINY_SPEC, "micro_batch_size": 64, "accumulation_steps": 8, "epochs": 1}
    del spec["max_steps"]
    job_id = make_job(spec)
    assert run_job(settings, job_id, "worker-a") == "succeeded"
    with session_factory(settings)() as session:
        rows, _ = metrics.read_metrics(session, job_id, name="loss", limit=10_000)
        saved = checkpoints.list_checkpoints(session, job_id)
    last = rows[-1]
    final = max(saved, key=lambda c: c.step)
    assert {r.epoch for r in rows} == {0}
    assert (final.step, final.epoch) == (last.step, last.epoch) == (last.step, 0)


def test_a_job_past_its_timeout_is_checkpointed_and_fails_with_reason_timeout(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    spec = {**TINY_SPEC, "max_steps": 10_000_000, "checkpoint_every": 10_000_000, "timeout": "1s"}
    job_id = make_job(spec)
    assert run_job(settings, job_id, "w") == "failed"
    job = load(settings, job_id)
    assert job.error["type"] == "JobTimeout" and job.error["reason"] == "timeout"
    assert "timeout of 1 s" in job.error["message"] and f"accum resume {job_id}" in job.error["message"]
    stopped_at = job.progress["optimizer_step"]
    with session_factory(settings)() as session:
        kept = [c.step for c in checkpoints.list_checkpoints(session, job_id)]
        rows, _ = metrics.read_metrics(session, job_id, name="loss", limit=10_000_000)
    assert 0 < stopped_at < 10_000_000 and kept == [stopped_at]
    assert [r.step for r in rows] == list(range(1, stopped_at + 1))
    assert kinds(settings, job_id)[-2:] == ["checkpoint", "failed"]
    # Resumed, it continues from there with a new timeout.
    with session_factory(settings).begin() as session:
        jobs.request_resume(session, jobs.load_job(session, job_id))
    assert run_job(settings, job_id, "w") == "failed"
    assert load(settings, job_id).progress["optimizer_step"] > stopped_at


def attempt_seconds(settings: Settings, job_id: str) -> list[float]:
    with session_factory(settings)() as session:
        job = jobs.load_job(session, job_id)
        assert job is not None
        return [(a.ended_at - a.started_at).total_seconds() for a in job.attempt_list]


@pytest.mark.timeout(120)  # per attempt, the second would run for an hour
def test_a_later_attempt_runs_only_what_is_left_of_the_jobs_timeout(
    settings: Settings, make_job: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = {**TINY_SPEC, "max_steps": 10_000_000, "checkpoint_every": 10_000_000, "timeout": "1h"}
    job_id = make_job(spec)
    fit = rank.build_run

    def build_then_shut_down(*args: Any, **kwargs: Any) -> Any:
        run = fit(*args, **kwargs)
        shutdown.requested.set()  # the first attempt's worker is stopped (SIGTERM)
        return run

    monkeypatch.setattr(rank, "build_run", build_then_shut_down)
    try:
        assert run_job(settings, job_id, "w") == Outcome.HANDED_BACK
    finally:
        shutdown.reset()
    monkeypatch.setattr(rank, "build_run", fit)
    handed_back = load(settings, job_id)
    assert handed_back.run_seconds == pytest.approx(sum(attempt_seconds(settings, job_id)))
    # As if that attempt had run for 59 min 59 s: one second of the hour is left.
    with session_factory(settings).begin() as session:
        jobs.load_job(session, job_id).run_seconds = 3599.0
    assert run_job(settings, job_id, "w") == "failed"
    job = load(settings, job_id)
    assert job.attempts == 2 and job.error["reason"] == "timeout"
    assert "timeout of 3600 s" in job.error["message"] and "over its attempts" in job.error["message"]
    with session_factory(settings)() as session:
        kept = [c.step for c in checkpoints.list_checkpoints(session, job_id)]
    assert job.progress["optimizer_step"] > (handed_back.resume_step or 0)
    assert kept[-1] == job.progress["optimizer_step"]  # checkpointed where it stopped
    assert job.run_seconds == pytest.approx(3599.0 + attempt_seconds(settings, job_id)[-1])
    # A resume counts from 0 again, under the new timeout it may give.
    with session_factory(settings).begin() as session:
        resumed = jobs.request_resume(session, jobs.load_job(session, job_id), timeout_s=7200)
        assert (resumed.run_seconds, resumed.spec["timeout"]) == (0.0, 7200)


def test_a_shutdown_hands_the_job_back_checkpointed_and_enqueued(
    settings: Settings, make_job: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM's flag set mid-run: the job stops, is checkpointed where it stopped, goes back
    to ``queued`` with a fresh message, and the attempt reports ``HANDED_BACK``."""
    fit = rank.build_run

    def build_then_shut_down(*args: Any, **kwargs: Any) -> Any:
        run = fit(*args, **kwargs)
        shutdown.requested.set()  # as Celery's worker_shutting_down does
        return run

    monkeypatch.setattr(rank, "build_run", build_then_shut_down)
    job_id = make_job({**TINY_SPEC, "max_steps": 50})
    try:
        assert run_job(settings, job_id, "w") == Outcome.HANDED_BACK
    finally:
        shutdown.reset()
    job = load(settings, job_id)
    assert job.status == "queued" and job.lease_owner is None
    assert kinds(settings, job_id)[-1] == "requeued"
    app = celery_app_for(settings)
    with app.connection_for_read() as conn:
        message = app.amqp.queues["default"](conn.default_channel).get(no_ack=True)
    assert message is not None and message.decode()[0] == [job_id]


def test_a_lost_lease_records_nothing(
    settings: Settings, make_job: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker took the job mid-run: this attempt reports ``LEASE_LOST`` and leaves the
    row to its new owner."""
    fit = rank.build_run

    def build_then_lose_the_lease(*args: Any, **kwargs: Any) -> Any:
        run = fit(*args, **kwargs)
        with session_factory(settings).begin() as session:
            job = jobs.load_job(session, job_id)
            assert job is not None
            job.lease_owner = "another-worker/1234"
        return run

    monkeypatch.setattr(rank, "build_run", build_then_lose_the_lease)
    job_id = make_job({**TINY_SPEC, "max_steps": 100_000})
    assert run_job(settings, job_id, "w") == Outcome.LEASE_LOST
    job = load(settings, job_id)
    assert job.status == "running" and job.lease_owner == "another-worker/1234"
    assert "succeeded" not in kinds(settings, job_id)
