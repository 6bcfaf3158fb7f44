"""The tracker host: a process of the attempt's own, started with ``spawn``, that never
imports torch and delivers what the training process hands over (TensorBoard's real writer,
read back with tensorboard's reader); one that dies is reported, and the job goes on."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from services.jobdb.events import list_events
from services.jobdb.sessions import session_factory
from services.jobdb.tracker_runs import runs_of
from services.settings import Settings
from services.spec import parse_spec
from services.worker.attempt import Attempt
from services.worker.checkpoints.resume import checkpoint_uploads
from services.worker.trackers.callback import TrackerCallback
from services.worker.trackers.job import job_trackers

SPEC = {"model": "mlp", "dataset": "digits", "micro_batch_size": 16, "accumulation_steps": 2, "max_steps": 40,
        "optimizer": {"name": "sgd", "lr": 0.05}, "gpus": 0, "trackers": ["tensorboard"]}


def tracked(settings: Settings, job_id: str, flush_every_s: float = 0.1) -> TrackerCallback:
    """The attempt's tracker callback, its host started as a fit's start does."""
    settings = settings.model_copy(update={"trackers": ["tensorboard"], "tracker_flush_every_s": flush_every_s})
    spec = parse_spec(SPEC)
    attempt = Attempt(job_id, 1, "node-a", None, spec.normalised())
    callback = job_trackers(settings, session_factory(settings), attempt, spec,
                            checkpoint_uploads(settings, attempt, None))
    assert callback is not None
    callback.on_fit_start(None)
    return callback


def forty_steps(callback: TrackerCallback) -> None:
    for step in range(1, 41):
        callback.on_step(None, {"step": float(step), "epoch": 0.0, "loss": 1 / step})


def started(callback: TrackerCallback) -> Any:
    deadline = time.monotonic() + 120
    while callback.host.started is None:
        assert time.monotonic() < deadline, "the tracker host did not start within 120 s"
        time.sleep(0.05)
    return callback.host.started


def test_the_host_is_another_process_without_torch_and_the_points_arrive(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job_id = make_job(SPEC)
    callback = tracked(settings, job_id)
    forty_steps(callback)
    callback.end(None)  # the run left open, as a hand-back does; everything delivered first
    host = started(callback)
    assert host.pid != os.getpid() and not host.torch_imported
    assert host.niceness == min(os.nice(0) + settings.tracker_host_nice, 19) > os.nice(0)
    assert callback.host.done.is_set() and not callback.host.process.is_alive()
    with session_factory(settings)() as session:
        [run] = runs_of(session, job_id)
    assert (run.tracker, run.delivered_step, run.undelivered) == ("tensorboard", 40, None)
    events = EventAccumulator(str(settings.artifacts_path / "tensorboard" / job_id),
                              size_guidance={"scalars": 0})
    events.Reload()
    got = [(e.step, e.value) for e in events.Scalars("loss")]
    assert got == [(step, pytest.approx(1 / step, rel=1e-6)) for step in range(1, 41)]


def test_a_flush_delivers_now_rather_than_a_flush_period_later(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job(SPEC)
    callback = tracked(settings, job_id, flush_every_s=600)
    started(callback)
    deadline = time.monotonic() + 60
    while not callback.host.status["tensorboard"].opened:  # the runs open at the host's start
        assert time.monotonic() < deadline, "the tensorboard run did not open within 60 s"
        time.sleep(0.05)
    forty_steps(callback)
    callback.host.flush()
    deadline = time.monotonic() + 60  # a tenth of the period: without the flush, nothing comes
    while callback.host.status["tensorboard"].delivered_step < 39:
        assert time.monotonic() < deadline, callback.host.status
        time.sleep(0.05)
    assert callback.host.status["tensorboard"].delivered_step == 39  # the last step held back
    callback.end(None)
    assert callback.host.done.is_set()


def test_a_host_that_dies_is_reported_and_the_job_goes_on(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job(SPEC)
    callback = tracked(settings, job_id)
    os.kill(started(callback).pid, signal.SIGKILL)
    assert callback.host.done.wait(60), "the host's death went unnoticed"
    forty_steps(callback)  # handed over to nobody: dropped, never raised
    callback.end("succeeded")
    with session_factory(settings)() as session:
        events = [e for e in list_events(session, job_id) if e.kind == "tracker_host_lost"]
    assert len(events) == 1 and events[0].data["exitcode"] == -signal.SIGKILL
    assert events[0].data["trackers"] == ["tensorboard"]
