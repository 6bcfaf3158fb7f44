"""Jobs submitted while the broker (a private ``redis-server``) is down, through the API, with
the store on PostgreSQL and a real worker at the production timings (reaper every 10 s, lost
messages re-sent after 300 s): they start within 10 s of the broker's return, in submit order,
not one ACCUM_REQUEUE_AFTER_S later; and a job submitted just after the return is sent after
them."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from worker_stack import Stack

from services.dispatch.priority import redis_list, redis_step
from services.jobdb import tokens
from services.jobdb.migrate import upgrade
from services.jobdb.queue_order import PRIORITIES
from services.settings import Settings

from .private_servers import PrivateRedis
from .test_redis_restart import submit_through_api

OUTAGE_S = 20.0  # the cut the audit found (issue 25, item 6)
START_WITHIN_S = 10.0
PRODUCTION = {"reaper_interval_s": 10.0, "requeue_after_s": 300.0,
              "lease_timeout_s": 5.0, "heartbeat_interval_s": 1.0}


def outage_stack(broker_url: str, database_url: str, tmp_path: Path, **more: Any) -> tuple[Stack, str]:
    settings = Settings(home=tmp_path / "home", broker_url=broker_url, database_url=database_url,
                        **PRODUCTION, **more)  # type: ignore[arg-type]
    upgrade(settings.database_url)
    (tmp_path / "logs").mkdir()
    stack = Stack("broker-outage", settings, f"bo-{uuid.uuid4().hex[:8]}", tmp_path / "logs")
    with stack.sessions.begin() as session:
        _, token = tokens.create_owner_with_token(session, f"outage-{uuid.uuid4().hex[:6]}")
    return stack, token


@pytest.mark.slow
def test_jobs_submitted_during_a_broker_outage_start_soon_after_it_returns(
    private_redis: PrivateRedis, stack_postgres_url: str, tmp_path: Path, record_figure: Any
) -> None:
    stack, token = outage_stack(private_redis.url, stack_postgres_url, tmp_path)
    stack.start_worker()
    try:
        warm = stack.create()
        assert stack.wait(warm, timeout=120).status == "succeeded"  # the worker consumes
        down_at = time.monotonic()
        private_redis.stop()
        submitted = []
        for _ in range(2):
            status, job_id, _ = submit_through_api(stack, token)
            assert status == 201, job_id
            submitted.append(job_id)
            time.sleep(2)
        time.sleep(max(OUTAGE_S - (time.monotonic() - down_at), 0))
        private_redis.start()
        back_at = time.time()
        jobs = [stack.wait(job_id, timeout=120) for job_id in submitted]
    finally:
        stack.stop_workers()
    delays = [job.started_at.timestamp() - back_at for job in jobs if job.started_at is not None]
    in_order = [job.id for job in sorted(jobs, key=lambda j: j.started_at)] == submitted
    record_figure(
        "broker_outage_submit",
        area="fault",
        check=f"2 jobs submitted through the API during a {OUTAGE_S:.0f} s Redis cut (PostgreSQL "
              "store, real worker, reaper every 10 s, ACCUM_REQUEUE_AFTER_S 300)",
        figure=f"started {', '.join(f'{d:.1f}' for d in delays)} s after the broker's return "
               f"(<= {START_WITHIN_S:.0f}), {'in' if in_order else 'not in'} submit order; was 300 s",
        passed=len(delays) == 2 and max(delays) <= START_WITHIN_S and in_order,
    )
    for job in jobs:
        assert job.status == "succeeded", (job.error, stack.worker_logs())
    assert max(delays) <= START_WITHIN_S, delays
    assert in_order, [(job.id, job.started_at) for job in jobs]


def delivery_order(broker: Any, queue: str) -> list[str]:
    """The job ids of the messages waiting on ``queue``, first delivered first (kombu LPUSHes
    and its consumer pops from the other end)."""
    messages = broker.lrange(redis_list(queue, redis_step(PRIORITIES["normal"])), 0, -1)
    return [raw.decode() for raw in reversed(messages)]


def test_a_job_submitted_after_the_return_is_sent_after_those_of_the_outage(
    private_redis: PrivateRedis, stack_postgres_url: str, tmp_path: Path
) -> None:
    # No worker: the queue is read instead (a queue no worker served is allowed for that).
    stack, token = outage_stack(private_redis.url, stack_postgres_url, tmp_path, allow_empty_queues=True)
    private_redis.stop()
    answers = [submit_through_api(stack, token) for _ in range(2)]
    private_redis.start()
    answers.append(submit_through_api(stack, token))
    assert [status for status, _, _ in answers] == [201] * 3, answers
    *during, after = [job_id for _, job_id, _ in answers]
    broker = redis.Redis.from_url(private_redis.url)
    try:
        order = delivery_order(broker, stack.queue)
    finally:
        broker.close()
    positions = [next(i for i, raw in enumerate(order) if job_id in raw) for job_id in [*during, after]]
    assert len(order) == 3 and positions == [0, 1, 2], (order, during, after)
