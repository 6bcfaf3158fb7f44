"""The cost of one enqueue on Redis: the one path kept (``enqueue_job``: Celery's
``send_task``) against a hand-built message (the removed ``redis_publish``: Celery's own
``as_task_v2`` body in kombu's Redis envelope, one LPUSH on a shared redis-py client).
One JSON object on stdout.

    PYTHONPATH=src:. .venv/bin/python bench/enqueue.py [--messages 2000] [--rounds 7] [--quick]

Each round times ``--messages`` publishes of each path, interleaved (who goes first
alternates), by CPU time of this process (what a publish costs the API's route thread) and
by wall time; the figure is the median over rounds of the per-round ratio send_task /
hand-built. Needs Redis (ACCUM_TEST_REDIS_URL, default redis://127.0.0.1:6379/1); the
queues it writes are deleted at the end.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from services.dispatch.broker import TASK_NAME
from services.dispatch.enqueue import celery_app_for, enqueue_job, reset_enqueue_cache
from services.settings import Settings


class HandBuilt:
    """What ``services/worker/redis_publish.py`` did before this change, kept here only to be
    measured: kombu's Redis envelope around Celery's protocol-2 message, one LPUSH."""

    def __init__(self, app: Celery, url: str) -> None:
        self.app = app
        self.client = redis.Redis.from_url(url)

    def publish(self, job_id: str, queue: str) -> None:
        args = [job_id]
        message = self.app.amqp.as_task_v2(
            str(uuid.uuid4()), TASK_NAME, args=args, kwargs={}, argsrepr=repr(args),
            kwargsrepr="{}",
        )
        envelope = {
            "body": base64.b64encode(json.dumps(message.body).encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": message.headers,
            "properties": {
                **message.properties,
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
        self.client.lpush(queue, json.dumps(envelope))


def timed(publish: Callable[[str], None], messages: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per message."""
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(messages):
        publish(f"job-{i}")
    return (time.process_time() - cpu) / messages, (time.perf_counter() - wall) / messages


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="smoke run: 50 messages, 2 rounds")
    args = parser.parse_args(argv)
    messages, rounds = (50, 2) if args.quick else (args.messages, args.rounds)
    url = os.environ.get("ACCUM_TEST_REDIS_URL", "redis://127.0.0.1:6379/1")
    home = Path(tempfile.mkdtemp(prefix="accum-bench-enqueue-"))
    settings = Settings(home=home, broker_url=url)
    queue_a, queue_b = f"bench-send-task-{uuid.uuid4().hex[:8]}", f"bench-hand-{uuid.uuid4().hex[:8]}"
    hand = HandBuilt(celery_app_for(settings), url)
    paths: dict[str, Callable[[str], None]] = {
        "send_task": lambda job_id: enqueue_job(settings, job_id, queue_a),
        "hand_built": lambda job_id: hand.publish(job_id, queue_b),
    }
    runs: list[dict[str, Any]] = []
    try:
        for publish in paths.values():  # warm-up: connections, declarations, caches
            timed(publish, 20)
        for r in range(rounds):
            order = list(paths) if r % 2 == 0 else list(reversed(paths))
            row: dict[str, Any] = {"first": order[0]}
            for name in order:
                cpu, wall = timed(paths[name], messages)
                row[f"{name}_cpu_us"], row[f"{name}_wall_us"] = cpu * 1e6, wall * 1e6
            runs.append(row)
        published = hand.client.llen(queue_a), hand.client.llen(queue_b)
    finally:
        hand.client.delete(queue_a, queue_b)
        hand.client.close()
        reset_enqueue_cache()

    def median(key: str) -> float:
        return round(statistics.median(row[key] for row in runs), 1)

    result = {
        "bench": "enqueue",
        "figure": "CPU per enqueue on Redis: send_task / hand-built LPUSH (median of per-round ratios)",
        "cpu_ratio": round(statistics.median(r["send_task_cpu_us"] / r["hand_built_cpu_us"] for r in runs), 2),
        "wall_ratio": round(statistics.median(r["send_task_wall_us"] / r["hand_built_wall_us"] for r in runs), 2),
        "send_task_cpu_us": median("send_task_cpu_us"),
        "hand_built_cpu_us": median("hand_built_cpu_us"),
        "send_task_wall_us": median("send_task_wall_us"),
        "hand_built_wall_us": median("hand_built_wall_us"),
        "messages_per_round": messages,
        "rounds": rounds,
        "published": list(published),
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1m": round(os.getloadavg()[0], 2)},
        "runs": runs,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
