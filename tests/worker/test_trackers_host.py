"""The tracker host: a process of the attempt's own, started with ``spawn``, that never imports
torch and delivers what the training process hands over (TensorBoard's real writer, read back
with tensorboard's reader).

What it still proves: the host is another process, without torch, niced below training, and
every point arrives; an attempt's end waits for it to deliver and exit; a flush delivers now
rather than a flush period later (the last step held back); a host that dies is reported
(``tracker_host_lost``) and the job goes on; a tracker still down at the attempt's end does
not hold the end up: the host outlives it, reports ``tracker_undelivered``, and delivers every
step, then ends the run, once the tracker is back (TensorBoard made unreachable by a file where
its folder goes; this was an end-to-end job with a second MLflow server started after it).

Every wait is for a condition (the host's messages, its exit, a row): the tests failed under
load when an attempt's end gave up after the default 30 s ``tracker_end_wait_s`` (or its exit
after the 10 s join) on a host process that runs niced below everything else, and on 60 s
deadlines for its start and delivery. ``HANG_S`` only bounds a hang.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
from recorded_clients import HANG_S, until
from tracker_attempts import send_steps
from tracker_attempts import tracked as tracked_attempt

from services.jobdb.events import list_events
from services.jobdb.sessions import session_factory
from services.jobdb.tracker_runs import runs_of
from services.settings import Settings
from services.worker.trackers.callback import TrackerCallback

SPEC = {"model": "mlp", "dataset": "digits", "micro_batch_size": 16, "accumulation_steps": 2, "max_steps": 40,
        "optimizer": {"name": "sgd", "lr": 0.05}, "gpus": 0, "trackers": ["tensorboard"]}
# A flush period the tests never reach: what arrives sooner came by a flush or an end.
LONG_PERIOD_S = 600.0
assert HANG_S < LONG_PERIOD_S


def tracked(settings: Settings, job_id: str, flush_every_s: float = 0.1,
            end_wait_s: float = HANG_S) -> TrackerCallback:
    """The attempt's tracker callback, its host started as a fit's start does. An attempt's end
    waits up to ``end_wait_s`` for the host: by default only a hang stops it waiting."""
    return tracked_attempt(settings, job_id, SPEC, flush_every_s=flush_every_s, end_wait_s=end_wait_s)


def forty_steps(callback: TrackerCallback) -> None:
    send_steps(callback, 40)


def started(callback: TrackerCallback) -> Any:
    def gone() -> str:
        process = callback.host.process
        return f"host process alive: {process.is_alive()}, exit code {process.exitcode}"

    return until(lambda: callback.host.started, "the tracker host's start", gone)


def tensorboard_losses(settings: Settings, job_id: str) -> tuple[list[tuple[int, float]], Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(settings.artifacts_path / "tensorboard" / job_id),
                              size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("loss")], events


def each_step_once(got: list[tuple[int, float]]) -> None:
    assert got == [(step, pytest.approx(1 / step, rel=1e-6)) for step in range(1, 41)]


def the_row(settings: Settings, job_id: str) -> Any:
    with session_factory(settings)() as session:
        [run] = runs_of(session, job_id)
        return run


def events_of(settings: Settings, job_id: str, kind: str) -> list[Any]:
    with session_factory(settings)() as session:
        return [e for e in list_events(session, job_id) if e.kind == kind]


def test_the_host_is_another_process_without_torch_and_the_points_arrive(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job(SPEC)
    callback = tracked(settings, job_id)
    forty_steps(callback)
    callback.end(None)  # the run left open, as a hand-back does; everything delivered first
    assert callback.host.done.is_set(), "the attempt's end did not wait for the host"
    host = started(callback)
    assert host.pid != os.getpid() and not host.torch_imported
    assert host.niceness == min(os.nice(0) + settings.tracker_host_nice, 19) > os.nice(0)
    assert callback.host.exited.wait(HANG_S) and not callback.host.process.is_alive()
    run = the_row(settings, job_id)
    assert (run.tracker, run.delivered_step, run.undelivered) == ("tensorboard", 40, None)
    each_step_once(tensorboard_losses(settings, job_id)[0])


def test_a_flush_delivers_now_rather_than_a_flush_period_later(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job(SPEC)
    callback = tracked(settings, job_id, flush_every_s=LONG_PERIOD_S)
    started(callback)
    status = callback.host.status
    until(lambda: callback.host.status["tensorboard"].opened,  # the runs open at the host's start
          "the tensorboard run's opening", lambda: status)
    forty_steps(callback)
    callback.host.flush()
    # Within HANG_S, well inside the period: without the flush nothing would come.
    until(lambda: callback.host.status["tensorboard"].delivered_step >= 39,
          "the flushed points' delivery", lambda: callback.host.status)
    assert callback.host.status["tensorboard"].delivered_step == 39  # the last step held back
    callback.end(None)
    assert callback.host.done.is_set()


def test_a_host_that_dies_is_reported_and_the_job_goes_on(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job(SPEC)
    callback = tracked(settings, job_id)
    os.kill(started(callback).pid, signal.SIGKILL)
    assert callback.host.done.wait(HANG_S), "the host's death went unnoticed"
    forty_steps(callback)  # handed over to nobody: dropped, never raised
    callback.end("succeeded")
    events = events_of(settings, job_id, "tracker_host_lost")
    assert len(events) == 1 and events[0].data["exitcode"] == -signal.SIGKILL
    assert events[0].data["trackers"] == ["tensorboard"]


def test_a_tracker_down_at_the_attempts_end_gets_every_step_from_the_host_once_back(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job(SPEC)
    blocker = settings.artifacts_path / "tensorboard"  # a file where the runs' folder goes
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder")
    callback = tracked(settings, job_id, end_wait_s=0)
    forty_steps(callback)
    callback.end("succeeded")  # does not wait for a tracker that is down
    assert not callback.host.done.is_set() and callback.host.process.is_alive()
    until(lambda: events_of(settings, job_id, "tracker_undelivered"), "the tracker_undelivered event")
    run = the_row(settings, job_id)
    assert run.delivered_step == -1 and run.undelivered.startswith("NotADirectoryError")

    blocker.unlink()  # the tracker is back
    assert callback.host.done.wait(HANG_S), "the host did not deliver once the tracker was back"
    run = the_row(settings, job_id)
    assert (run.delivered_step, run.undelivered) == (40, None)
    assert [e.data["step"] for e in events_of(settings, job_id, "tracker_delivered")] == [40]
    losses, events = tensorboard_losses(settings, job_id)
    each_step_once(losses)
    [status] = events.Tensors("accum/status/text_summary")  # the run ended with the job's status
    assert status.tensor_proto.string_val == [b"succeeded"]
