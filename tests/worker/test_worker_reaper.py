"""The reaper re-queues a job whose lease expired and sends a fresh message for it."""

from __future__ import annotations

import time
from collections.abc import Callable

from kombu import Connection

from services.settings import Settings
from services.store import jobs, leases
from services.worker.app import TASK_NAME, make_celery
from services.worker.db import session_factory
from services.worker.reaper import LeaseReaper, reap_once


def claim_with_short_lease(settings: Settings, job_id: str) -> None:
    with session_factory(settings).begin() as session:
        assert leases.claim_job(session, job_id, "dead-worker", "host", "cpu", lease_timeout_s=0.05)


def queued_job_ids(settings: Settings, queue: str) -> list[str]:
    app = make_celery(settings, queues=[queue])
    found = []
    with Connection(settings.broker_url) as conn:
        q = app.conf.task_queues[0](conn.default_channel)
        while (message := q.get(no_ack=True)) is not None:
            assert message.headers["task"] == TASK_NAME
            found.append(message.decode()[0][0])
    return found


def test_expired_lease_is_requeued_and_enqueued_on_the_jobs_queue(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job(queue="a100")
    live_id = make_job(queue="a100")
    claim_with_short_lease(settings, job_id)
    with session_factory(settings).begin() as session:
        assert leases.claim_job(session, live_id, "live-worker", "host", "cpu", lease_timeout_s=600)
    time.sleep(0.1)
    assert reap_once(settings) == [job_id]
    with session_factory(settings)() as session:
        assert jobs.load_job(session, job_id).status == "queued"  # type: ignore[union-attr]
        assert jobs.load_job(session, live_id).status == "running"  # type: ignore[union-attr]
    assert queued_job_ids(settings, "a100") == [job_id]
    assert reap_once(settings) == []  # nothing left to reap


def test_reaper_thread_reaps_periodically(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job()
    claim_with_short_lease(settings, job_id)
    reaper = LeaseReaper(settings, interval_s=0.05).start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with session_factory(settings)() as session:
                if jobs.load_job(session, job_id).status == "queued":  # type: ignore[union-attr]
                    break
            time.sleep(0.05)
    finally:
        reaper.stop()
    assert queued_job_ids(settings, "default") == [job_id]
