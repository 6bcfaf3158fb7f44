"""Where an attempt's time went: the worker times its phases and records them on the attempt
(``job_attempts.phases``, ``services.worker.phases``), in the order they ran."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from job_specs import TINY_SPEC

from services.jobdb.models import Job, JobAttempt
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker import phases, rank
from services.worker.runner import run_job


def recorded(settings: Settings, job_id: str) -> tuple[Job, dict[str, float] | None]:
    with session_factory(settings)() as session:
        job = session.get(Job, job_id)
        assert job is not None
        attempt = session.get(JobAttempt, (job_id, job.attempts))
        assert attempt is not None
        return job, attempt.phases


def test_a_run_records_each_phase_in_order_within_the_attempts_time(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job({**TINY_SPEC, "verify_window": True})
    started = time.perf_counter()
    assert run_job(settings, job_id, "w") == "succeeded"
    wall = time.perf_counter() - started
    job, taken = recorded(settings, job_id)
    assert taken is not None
    # No trackers named: no tracker_end.
    assert list(taken) == ["claim", "admit", "build", "checks", "train", "final_writes", "finish"]
    assert all(seconds >= 0 for seconds in taken.values())
    assert sum(taken.values()) <= wall + 0.01  # rounded to the millisecond each
    assert taken["build"] > 0 and taken["train"] > 0


def test_a_job_that_fails_while_building_records_the_phases_it_reached(
    settings: Settings, make_job: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no model today")

    monkeypatch.setattr(rank, "build_run", explode)
    job_id = make_job()
    assert run_job(settings, job_id, "w") == "failed"
    _, taken = recorded(settings, job_id)
    assert taken is not None and list(taken) == ["claim", "admit", "finish"]


def test_marks_count_once_in_the_order_they_happened_and_only_after_begin() -> None:
    phases.end()
    phases.mark("claim")
    assert phases.taken() == {}  # a spawned rank: nothing begun, nothing timed
    phases.begin()
    phases.mark("claim")
    phases.mark("train")  # a phase left out ("build") adds its time to the next one marked
    phases.mark("claim")  # again: the first counts
    assert list(phases.taken()) == ["claim", "train"]
    phases.begin()
    assert phases.taken() == {}
    phases.end()


def test_a_job_on_ranks_of_their_own_records_their_time_as_train(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job({**TINY_SPEC, "gpus": 2})  # 2 gloo ranks, spawned (the worker offers 2 CPU ranks)
    assert run_job(settings, job_id, "w") == "succeeded"
    _, taken = recorded(settings, job_id)
    assert taken is not None and list(taken) == ["claim", "admit", "train", "finish"]
