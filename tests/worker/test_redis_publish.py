"""The Redis fast path of ``enqueue_job`` writes the same message Celery's ``send_task`` does:
same envelope and header fields, decodable by kombu, on the job's queue; a higher priority
is taken first."""

from __future__ import annotations

import json
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from kombu import Connection

from services.settings import Settings
from services.worker.app import TASK_NAME, declare_queue, make_celery
from services.worker.enqueue import enqueue_job, publisher_for, reset_enqueue_cache


def raw_messages(url: str, queue: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in redis.Redis.from_url(url).lrange(queue, 0, -1)]


def test_fast_path_message_matches_celerys_and_decodes(tmp_path: Path, redis_url: str) -> None:
    settings = Settings(home=tmp_path, broker_url=redis_url)
    fast_queue, celery_queue = f"fast-{uuid.uuid4().hex[:8]}", f"celery-{uuid.uuid4().hex[:8]}"
    try:
        enqueue_job(settings, "job-1", fast_queue, priority=2)  # high: the queue's own list
        make_celery(settings).send_task(
            TASK_NAME, args=["job-2"], queue=declare_queue(celery_queue), routing_key=celery_queue
        )
        (fast,) = raw_messages(redis_url, fast_queue)
        (slow,) = raw_messages(redis_url, celery_queue)
        assert fast.keys() == slow.keys()
        assert fast["headers"].keys() == slow["headers"].keys()
        assert fast["properties"].keys() == slow["properties"].keys()
        assert fast["properties"]["delivery_info"] == {"exchange": "", "routing_key": fast_queue}

        app = make_celery(settings, queues=[fast_queue])
        with Connection(redis_url) as conn:
            message = app.conf.task_queues[0](conn.default_channel).get(no_ack=True)
        assert message is not None
        assert message.headers["task"] == TASK_NAME
        assert message.decode()[0] == ["job-1"]
    finally:
        redis.Redis.from_url(redis_url).delete(fast_queue, celery_queue)
        reset_enqueue_cache()


def test_unreachable_redis_fails_fast(tmp_path: Path) -> None:
    """A broker that is down raises within seconds (the API logs it, the reaper re-sends)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(home=tmp_path, broker_url=f"redis://127.0.0.1:{port}/0")
    started = time.monotonic()
    try:
        try:
            enqueue_job(settings, "job-1", "default")
        except redis.ConnectionError:
            pass
        else:
            raise AssertionError("publishing to a closed port succeeded")
        assert time.monotonic() - started < 5
        assert publisher_for(settings) is publisher_for(settings)  # one client, reused
    finally:
        reset_enqueue_cache()


def test_a_queue_gives_its_higher_priorities_first(tmp_path: Path, redis_url: str) -> None:
    """Sent low, normal, high, unknown (normal): taken high, normal, normal, low."""
    settings = Settings(home=tmp_path, broker_url=redis_url)
    queue = f"pri-{uuid.uuid4().hex[:8]}"
    try:
        for job_id, priority in (("low", 0), ("normal", 1), ("high", 2), ("unset", None)):
            enqueue_job(settings, job_id, queue, priority)
        app = make_celery(settings, queues=[queue])
        taken = []
        with Connection(redis_url) as conn:
            consumer = app.conf.task_queues[0](conn.default_channel)
            while (message := consumer.get(no_ack=True)) is not None:
                taken.append(message.decode()[0][0])
        assert taken == ["high", "normal", "unset", "low"]
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(*(client.keys(f"{queue}*") or [queue]))
        reset_enqueue_cache()
