"""The cost of one enqueue on Redis: Celery's ``send_task`` against ``enqueue_job``'s Redis
path (``services/dispatch/redis_publish.py``: Celery's own ``as_task_v2`` message in kombu's
Redis envelope, one LPUSH on a shared redis-py client). One JSON object on stdout.

    .venv/bin/python -m bench.service.enqueue [--messages 2000] [--rounds 7] [--quick] [--out [DIR]]

Each round times ``--messages`` publishes of each path, interleaved (who goes first
alternates), by CPU time of this process (what a publish costs the API's route thread) and
by wall time; the figure is the median over rounds of the per-round ratio send_task /
hand-built. Needs Redis (ACCUM_TEST_REDIS_URL, default redis://127.0.0.1:6379/1); the
queues it writes are deleted at the end.
"""

from __future__ import annotations

import argparse
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

from bench.harness import common as _common
from services.dispatch.broker import TASK_NAME, declare_queue
from services.dispatch.enqueue import celery_app_for, enqueue_job, reset_enqueue_cache
from services.dispatch.priority import NORMAL, redis_list, redis_step
from services.settings import Settings


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
    _common.add_out_argument(parser)
    args = parser.parse_args(argv)
    messages, rounds = (50, 2) if args.quick else (args.messages, args.rounds)
    url = os.environ.get("ACCUM_TEST_REDIS_URL", "redis://127.0.0.1:6379/1")
    home = Path(tempfile.mkdtemp(prefix="accum-bench-enqueue-"))
    settings = Settings(home=home, broker_url=url)
    queue_a, queue_b = f"bench-send-task-{uuid.uuid4().hex[:8]}", f"bench-hand-{uuid.uuid4().hex[:8]}"
    app = celery_app_for(settings)
    paths: dict[str, Callable[[str], None]] = {
        "send_task": lambda job_id: app.send_task(
            TASK_NAME, args=[job_id], queue=declare_queue(queue_a), routing_key=queue_a
        ),
        # At a normal job's priority, as the API sends it: kombu's priority-step list.
        "hand_built": lambda job_id: enqueue_job(settings, job_id, queue_b, NORMAL),
    }
    list_b = redis_list(queue_b, redis_step(NORMAL))
    client = redis.Redis.from_url(url)
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
        published = client.llen(queue_a), client.llen(list_b)
    finally:
        client.delete(queue_a, queue_b, list_b)
        client.close()
        reset_enqueue_cache()

    def median(key: str) -> float:
        return round(statistics.median(row[key] for row in runs), 1)

    result = {
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
    _common.emit("enqueue", result, args)
    return result


if __name__ == "__main__":
    main()
