"""A cheap publish path for Redis brokers: one LPUSH on a shared client.

Celery's ``send_task`` took about 5x this path's CPU per message on Redis (bench/service/enqueue.py:
kombu builds a Redis client for every publish, wraps it in its retry machinery and sends
Celery's signals), on the API's ``POST /v1/jobs``. The broker only carries a nudge, so here
the message is built by Celery itself (``app.amqp.as_task_v2``: protocol 2 headers and body)
and wrapped in the envelope kombu's Redis transport stores for a direct publish to a queue,
then pushed with a redis-py client that is thread-safe (its connection pool is shared by the
API's route threads and the reaper). Workers consume it like any Celery message.

The envelope is kombu's internal format: Celery and kombu are pinned in constraints.txt, and
``tests/dispatch/test_redis_publish.py`` compares it with the one kombu writes for the same
task, field by field, and has a worker's consumer decode it. Re-run that test when the pins move.

    publisher = RedisPublisher(app, "redis://localhost:6379/0")
    publisher.publish("accum.run_job", ["<job id>"], queue="default")
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import redis
from celery import Celery
from celery.utils.nodenames import anon_nodename
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from services.dispatch.priority import redis_list, redis_step

REDIS_SCHEMES = ("redis", "rediss")
# Persistent delivery (AMQP's delivery_mode 2), as kombu marks every Celery task message.
PERSISTENT = 2


def is_redis_url(url: str) -> bool:
    return url.split("://", 1)[0] in REDIS_SCHEMES


class RedisPublisher:
    """Publishes Celery task messages onto Redis queues; safe to share between threads."""

    def __init__(self, app: Celery, url: str) -> None:
        self.app = app
        self.origin = anon_nodename()  # what Celery puts in `origin` (looked up once, not per send)
        # A broker that is down must fail the send within about a second, not hang a request:
        # the job is committed already and the reaper re-sends lost messages.
        self.client = redis.Redis.from_url(
            url,
            socket_connect_timeout=1.0,
            socket_timeout=5.0,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 2),
        )

    def envelope(
        self, task_name: str, args: list[Any], queue: str, step: int = 0
    ) -> dict[str, Any]:
        """The message as kombu's Redis transport stores it (what a worker decodes)."""
        task_id = str(uuid.uuid4())
        message = self.app.amqp.as_task_v2(
            task_id,
            task_name,
            args=args,
            kwargs={},
            origin=self.origin,
            argsrepr=repr(args),  # short job ids: no need for saferepr's truncation
            kwargsrepr="{}",
            ignore_result=None,  # as send_task leaves it: the task's own setting applies
        )
        body = json.dumps(message.body).encode()
        return {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": message.headers,
            "properties": {
                **message.properties,
                "delivery_mode": PERSISTENT,
                # The default exchange routes by queue name, as send_task(queue=...) does.
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": step,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }

    def publish(
        self, task_name: str, args: list[Any], queue: str, priority: int | None = None
    ) -> None:
        # Each priority step has its own list (services/dispatch/priority.py).
        step = redis_step(priority)
        self.client.lpush(redis_list(queue, step), json.dumps(self.envelope(task_name, args, queue, step)))

    def close(self) -> None:
        self.client.close()
