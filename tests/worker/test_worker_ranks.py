"""A ``gpus: k`` job on a worker with fewer ranks (no GPU, ``cpu_ranks`` below k): left to a
worker of its queue that registered enough (the fleet the submit check reads), else failed with
the fix, never trained on ranks this worker did not register (services/worker/runner.py,
``left_to_a_bigger_worker``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from job_specs import TINY_SPEC
from worker_rows import worker_row

from services.jobdb import events, jobs
from services.jobdb import workers as store_workers
from services.jobdb.sessions import session_factory
from services.jobdb.types import utcnow
from services.settings import Settings
from services.worker.attempt import Outcome
from services.worker.runner import run_job

SPEC = {**TINY_SPEC, "gpus": 2}


def load(settings: Settings, job_id: str) -> Any:
    with session_factory(settings)() as session:
        return jobs.load_job(session, job_id)


def test_a_job_with_more_ranks_than_the_worker_offers_fails_naming_cpu_ranks(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    plain = settings.model_copy(update={"cpu_ranks": 0})
    job_id = make_job(SPEC)
    assert run_job(plain, job_id, "plain@n") == Outcome.FAILED
    job = load(plain, job_id)
    assert job.progress["optimizer_step"] == 0
    assert "gpus 2 needs a worker with 2 ranks (GPUs, or CPU ranks); the worker that took it has no GPU" in job.error["message"]
    assert "`--cpu-ranks 2` (`accum worker` or `accum up`)" in job.error["message"] and f"POST /v1/jobs/{job_id}/resume" in job.error["message"]
    with session_factory(plain)() as session:
        kinds = [e.kind for e in events.list_events(session, job_id)]
    assert "checkpoint" not in kinds  # nothing trained


def test_it_waits_for_a_registered_worker_of_its_queue_with_enough_ranks(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    plain = settings.model_copy(update={"cpu_ranks": 0})
    ranked = {"kind": "cpu", "name": "cpu", "cores": 4, "ranks": 2}
    with session_factory(plain).begin() as session:
        store_workers.register(session, worker_row("ranked@n", ["default"], devices=[ranked]))
    job_id = make_job(SPEC)
    assert run_job(plain, job_id, "plain@n") == Outcome.SKIPPED
    job = load(plain, job_id)
    assert (job.status, job.attempts) == ("queued", 0)
    with session_factory(plain).begin() as session:
        store_workers.mark_stopped(session, "ranked@n")  # the submit check still counts it
    assert run_job(plain, job_id, "plain@n") == Outcome.SKIPPED
    with session_factory(plain).begin() as session:  # gone past ACCUM_QUEUE_GRACE_S
        store_workers.register(session, worker_row("ranked@n", ["default"], devices=[ranked]),
                               now=utcnow() - timedelta(seconds=plain.queue_grace_s + 1))
    assert run_job(plain, job_id, "plain@n") == Outcome.FAILED
