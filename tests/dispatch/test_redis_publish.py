"""The Redis path of ``enqueue_job`` writes the message Celery's ``send_task`` writes through
kombu: the same envelope, header and property fields with the same values (ids and the
sender's node name aside), on the job's queue, decodable by a worker's consumer. It guards
the hand-built envelope (services/dispatch/redis_publish.py) against the pinned kombu; a higher
priority is taken first."""

from __future__ import annotations

import base64
import json
import time
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis
from kombu import Connection

from services.dispatch.broker import TASK_NAME, declare_queue, make_celery
from services.dispatch.enqueue import enqueue_job, publisher_for, reset_enqueue_cache
from services.dispatch.priority import PRIORITY_STEPS, REDIS_STEPS
from services.ports import free_port
from services.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
# Fields that differ between any two messages: fresh ids, and where the sender runs; and
# reply_to, the queue a result would be sent to (send_task fills in its thread's id; our task
# keeps no result, so the hand-built message leaves it empty).
PER_MESSAGE = {"id", "root_id", "correlation_id", "delivery_tag", "origin", "argsrepr", "reply_to"}


def raw_messages(url: str, queue: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in redis.Redis.from_url(url).lrange(queue, 0, -1)]


def comparable(envelope: dict[str, Any]) -> dict[str, Any]:
    """The envelope with its per-message values dropped and its body decoded."""
    return {
        **{k: v for k, v in envelope.items() if k not in ("headers", "properties", "body")},
        "headers": {k: v for k, v in envelope["headers"].items() if k not in PER_MESSAGE},
        "properties": {
            k: v for k, v in envelope["properties"].items() if k not in PER_MESSAGE
        },
        "body": json.loads(base64.b64decode(envelope["body"]))[1:],  # args aside: job ids differ
    }


def test_celery_and_kombu_are_pinned_to_the_versions_installed() -> None:
    pins = dict(
        line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert pins.get("celery") == version("celery") and pins.get("kombu") == version("kombu"), (
        "the hand-built envelope was checked against the pinned kombu: move the pins in "
        "constraints.txt together with this test passing"
    )


def test_the_priority_steps_restated_are_kombus() -> None:
    from kombu.transport.redis import PRIORITY_STEPS as KOMBU_STEPS

    assert tuple(KOMBU_STEPS) == PRIORITY_STEPS
    assert set(REDIS_STEPS.values()) <= set(PRIORITY_STEPS)


def test_the_hand_built_message_is_kombus_and_decodes(tmp_path: Path, redis_url: str) -> None:
    settings = Settings(home=tmp_path, broker_url=redis_url)
    fast_queue, celery_queue = f"fast-{uuid.uuid4().hex[:8]}", f"celery-{uuid.uuid4().hex[:8]}"
    try:
        enqueue_job(settings, "job-1", fast_queue, priority=2)  # high: the queue's own list
        make_celery(settings).send_task(
            TASK_NAME, args=["job-2"], queue=declare_queue(celery_queue), routing_key=celery_queue
        )
        (fast,) = raw_messages(redis_url, fast_queue)
        (kombus,) = raw_messages(redis_url, celery_queue)
        fast_fields, kombu_fields = comparable(fast), comparable(kombus)
        kombu_fields["properties"]["delivery_info"]["routing_key"] = fast_queue
        assert fast_fields == kombu_fields
        assert fast["properties"]["delivery_info"] == {"exchange": "", "routing_key": fast_queue}
        assert fast["headers"]["argsrepr"] == "['job-1']"

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
    settings = Settings(home=tmp_path, broker_url=f"redis://127.0.0.1:{free_port()}/0")
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
