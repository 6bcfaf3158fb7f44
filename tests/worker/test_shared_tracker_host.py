"""The worker's shared tracker host (``handover.share_host``: what ``start_worker`` turns on):
one process serves every attempt, its clients imported once, instead of a host process spawned
(and its clients imported again, ~3 s) at each attempt (issue 45). Attempts in a row are served
by the same process and each gets every step once; a host that dies is reported by the
attempts it served and the next attempt starts another."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tracker_attempts import send_steps, tracked

from services.jobdb.events import list_events
from services.jobdb.sessions import session_factory
from services.jobdb.tracker_runs import runs_of
from services.settings import Settings
from services.worker.trackers import handover
from services.worker.trackers.callback import TrackerCallback

SPEC = {"model": "mlp", "dataset": "digits", "micro_batch_size": 16, "accumulation_steps": 2, "max_steps": 5,
        "optimizer": {"name": "sgd", "lr": 0.05}, "gpus": 0, "trackers": ["tensorboard"]}
HANG_S = 240.0  # bounds a hang only: every wait returns once its condition holds


def until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + HANG_S
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what}: not within {HANG_S:g} s"
        time.sleep(0.02)
    return result


@pytest.fixture
def shared() -> Iterator[handover.SharedHost]:
    yield handover.share_host()
    handover.unshare_host()


def attempt_of(settings: Settings, job_id: str) -> TrackerCallback:
    return tracked(settings, job_id, SPEC, flush_every_s=0.1, end_wait_s=HANG_S)


def five_steps(callback: TrackerCallback) -> None:
    send_steps(callback, 5)


def delivered(settings: Settings, job_id: str) -> int:
    with session_factory(settings)() as session:
        [run] = runs_of(session, job_id)
        return int(run.delivered_step)


def test_attempts_in_a_row_are_served_by_one_host_process_that_stays(
    settings: Settings, make_job: Callable[..., str], shared: handover.SharedHost
) -> None:
    def one_attempt() -> int:
        job_id = make_job(SPEC)
        callback = attempt_of(settings, job_id)
        five_steps(callback)
        callback.end("succeeded")
        assert callback.host.done.is_set(), "the attempt's end did not wait for its delivery"
        started = until(lambda: callback.host.started, "the host's start")
        assert started.pid != os.getpid() and not started.torch_imported
        assert delivered(settings, job_id) == 5
        assert until(callback.host.exited.is_set, "the attempt's connection closed")
        return int(started.pid)

    assert one_attempt() == one_attempt() == shared.process.pid and shared.process.is_alive()


def test_a_shared_host_that_dies_is_reported_and_the_next_attempt_starts_another(
    settings: Settings, make_job: Callable[..., str], shared: handover.SharedHost
) -> None:
    job_id = make_job(SPEC)
    callback = attempt_of(settings, job_id)
    first = until(lambda: callback.host.started, "the host's start").pid
    os.kill(first, signal.SIGKILL)
    assert callback.host.done.wait(HANG_S), "the host's death went unnoticed"
    five_steps(callback)  # handed over to nobody: dropped, never raised
    callback.end("succeeded")
    with session_factory(settings)() as session:
        lost = [e for e in list_events(session, job_id) if e.kind == "tracker_host_lost"]
    assert len(lost) == 1 and lost[0].data["exitcode"] == -signal.SIGKILL

    job_id = make_job(SPEC)
    callback = attempt_of(settings, job_id)
    five_steps(callback)
    callback.end("succeeded")
    assert until(lambda: callback.host.started, "the new host's start").pid != first
    assert delivered(settings, job_id) == 5


def test_the_runs_status_text_is_torchs_summary_built_without_torch() -> None:
    from torch.utils.tensorboard.summary import text

    from services.worker.trackers.tensorboard_events import text_summary

    for message in ("succeeded", "failed: ünïcode"):
        assert text_summary("accum/status", message).SerializeToString() == \
            text("accum/status", message).SerializeToString()
