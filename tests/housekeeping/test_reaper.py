"""The reaper re-queues a job whose lease expired and sends a fresh message for it. Its clock
is injected: a test moves time forward instead of sleeping past a lease or a period."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from job_specs import TINY_SPEC
from kombu import Connection
from worker_rows import worker_row

from services.dispatch.broker import TASK_NAME, make_celery
from services.dispatch.enqueue import enqueue_job
from services.housekeeping.reaper import (
    LeaseReaper,
    reap_once,
    resend_for_idle_workers_once,
    resend_stale_once,
)
from services.jobdb import jobs, leases, tokens
from services.jobdb import workers as store_workers
from services.jobdb.sessions import session_factory
from services.settings import Settings

LEASE_S = 30.0


def ahead(seconds: float) -> Callable[[], float]:
    """A clock ``seconds`` ahead of the wall clock the store stamps rows with."""
    return lambda: time.time() + seconds


def claim_with_lease(settings: Settings, job_id: str) -> None:
    with session_factory(settings).begin() as session:
        assert leases.claim_job(session, job_id, "dead-worker", "host", "cpu", lease_timeout_s=LEASE_S)


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
    claim_with_lease(settings, job_id)
    with session_factory(settings).begin() as session:
        assert leases.claim_job(session, live_id, "live-worker", "host", "cpu", lease_timeout_s=600)
    assert reap_once(settings) == []  # the lease still runs
    assert reap_once(settings, clock=ahead(LEASE_S + 1)) == [job_id]
    with session_factory(settings)() as session:
        assert jobs.load_job(session, job_id).status == "queued"  # type: ignore[union-attr]
        assert jobs.load_job(session, live_id).status == "running"  # type: ignore[union-attr]
    assert queued_job_ids(settings, "a100") == [job_id]
    assert reap_once(settings, clock=ahead(LEASE_S + 1)) == []  # nothing left to reap


def test_reaper_thread_reaps_periodically(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job()
    claim_with_lease(settings, job_id)
    reaper = LeaseReaper(settings, interval_s=0.05, clock=ahead(LEASE_S + 1)).start()
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


def test_queued_job_with_a_lost_message_is_enqueued_again_once_per_period(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    """A job left queued with no broker message (the API could not reach the broker) gets one
    from the reaper once its last enqueue is older than ACCUM_REQUEUE_AFTER_S, and not again
    before another period has passed (no pile-up on a queue no worker listens to)."""
    settings = settings.model_copy(update={"requeue_after_s": 300})
    lost_id = make_job(queue="a100")  # created, never enqueued
    running_id = make_job(queue="a100")
    with session_factory(settings).begin() as session:
        assert leases.claim_job(session, running_id, "live", "host", "cpu", lease_timeout_s=600)
    assert resend_stale_once(settings) == []  # just submitted: its message may well be on its way
    assert resend_stale_once(settings, clock=ahead(301)) == [lost_id]
    assert resend_stale_once(settings, clock=ahead(301)) == []  # re-sent just now
    assert resend_stale_once(settings, clock=ahead(600)) == []  # less than a period since
    assert queued_job_ids(settings, "a100") == [lost_id]
    # still queued a period after the re-send: once more
    assert resend_stale_once(settings, clock=ahead(602)) == [lost_id]


def test_a_job_beside_an_idle_worker_is_sent_again_only_when_the_broker_holds_no_message(
    settings: Settings, redis_url: str
) -> None:
    """Issue 42 item 3, on a real Redis: of three queued jobs, one's message waits on the queue,
    one's was taken by a consumer and not acknowledged (a worker between taking it and claiming
    the job: listed idle), one's was lost. With a worker of the queue idle, only the lost one
    is sent again, after ACCUM_IDLE_REQUEUE_AFTER_S, once; none while every worker is busy, nor
    one the running cap holds; the embedded broker, which cannot be read so, is left alone."""
    settings = settings.model_copy(update={
        "broker_url": redis_url, "requeue_after_s": 300, "idle_requeue_after_s": 5,
        "lease_timeout_s": 60, "max_running_jobs_per_owner": 1})
    with session_factory(settings).begin() as session:
        alice, _ = tokens.create_owner_with_token(session, "alice")
        bob, _ = tokens.create_owner_with_token(session, "bob")
        taken, waiting, lost, held, running = (
            jobs.create_job(session, owner=owner, spec=TINY_SPEC, queue="q")[0].id
            for owner in (alice, alice, alice, bob, bob))
    enqueue_job(settings, taken, "q")
    enqueue_job(settings, waiting, "q")
    with Connection(redis_url) as conn:
        consumer = make_celery(settings, queues=["q"]).conf.task_queues[0](conn.default_channel)
        message = consumer.get(no_ack=False)  # kombu keeps it in Redis's unacked hash until acked
        assert message is not None and message.decode()[0] == [taken]
        assert resend_for_idle_workers_once(settings, clock=ahead(6)) == []  # no worker
        with session_factory(settings).begin() as session:
            store_workers.register(session, worker_row("idle@n1", ["q"]))
            store_workers.register(session, worker_row("busy@n2", ["q"]))
            assert leases.claim_job(session, running, "busy@n2/1", "n2", "cpu", lease_timeout_s=600,
                                    worker_name="busy@n2")
        # `held`: bob runs `running`, at the cap of 1
        assert resend_for_idle_workers_once(settings) == []  # too soon: a message may be on its way
        embedded = settings.model_copy(update={"broker_url": Settings(home=settings.home).broker_url})
        assert resend_for_idle_workers_once(embedded, clock=ahead(6)) == []
        assert resend_for_idle_workers_once(settings, clock=ahead(6)) == [lost]
        assert resend_for_idle_workers_once(settings, clock=ahead(12)) == []  # its message waits now
        message.ack()
    with session_factory(settings).begin() as session:
        assert leases.claim_job(session, lost, "idle@n1/1", "n1", "cpu", lease_timeout_s=600,
                                worker_name="idle@n1")
    # both workers busy now: `taken` (acked, unclaimed) is left to ACCUM_REQUEUE_AFTER_S
    assert resend_for_idle_workers_once(settings, clock=ahead(20)) == []
    assert queued_job_ids(settings, "q") == [waiting, lost]


def test_a_workers_reaper_resends_the_jobs_of_its_own_queues_only(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    """A worker's reaper sends through its own broker: a stale job of another queue (another
    deployment's, whose broker may differ) is left to that queue's reapers, or to the API's,
    which take every queue."""
    settings = settings.model_copy(update={"requeue_after_s": 300})
    ours = make_job(queue="a100")
    theirs = make_job(queue="t4")
    assert resend_stale_once(settings, clock=ahead(301), queues=["a100"]) == [ours]
    assert queued_job_ids(settings, "t4") == []
    assert resend_stale_once(settings, clock=ahead(301)) == [theirs]  # the API's: every queue
    assert queued_job_ids(settings, "t4") == [theirs]


def test_a_failed_send_is_retried_at_the_next_pass_in_submit_order(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    """A reaped job whose message cannot be sent (the broker down: nothing listens on port 1)
    is marked unsent with the jobs after it, and the next pass sends them all, oldest first,
    without waiting ACCUM_REQUEUE_AFTER_S."""
    settings = settings.model_copy(update={"requeue_after_s": 300})
    first, second = make_job(), make_job()
    for job_id in (first, second):
        claim_with_lease(settings, job_id)
    down = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with pytest.raises(Exception, match="127.0.0.1:1|Connection refused|Error 111"):
        reap_once(down, clock=ahead(LEASE_S + 1))
    with session_factory(settings)() as session:
        assert [jobs.load_job(session, j).enqueued_at for j in (first, second)] == [None, None]  # type: ignore[union-attr]
    assert resend_stale_once(settings) == [first, second]  # no clock ahead: the very next pass
    assert queued_job_ids(settings, "default") == [first, second]


def test_reaper_thread_resends_lost_messages(settings: Settings, make_job: Callable[..., str]) -> None:
    settings = settings.model_copy(update={"requeue_after_s": 300})
    job_id = make_job()
    reaper = LeaseReaper(settings, interval_s=0.05, clock=ahead(301)).start()
    try:
        deadline = time.monotonic() + 10
        found: list[str] = []
        while time.monotonic() < deadline and not found:
            time.sleep(0.1)
            found = queued_job_ids(settings, "default")
    finally:
        reaper.stop()
    assert found[:1] == [job_id]
