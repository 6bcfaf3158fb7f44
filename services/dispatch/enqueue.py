"""Send a job's nudge to the workers: ``enqueue_job(settings, job_id, queue)``, the one entry.

Called by the API after the transaction that created (or re-queued) the job has committed, by
the lease reaper, and by a worker handing its job back. Torch-free and cheap: one Celery app
per broker URL, reused across calls. On Redis the message goes out through one shared,
thread-safe client (``redis_publish``: Celery's own message in kombu's envelope, one LPUSH),
because Celery's ``send_task`` cost about 5x its CPU per message (bench/service/enqueue.py,
docs/benchmarks.md) on the API's hot path; every other broker gets ``send_task``. Celery and
kombu are pinned (constraints.txt) and ``tests/dispatch/test_redis_publish.py`` checks the
envelope against the one kombu writes.
"""

from __future__ import annotations

import threading

from celery import Celery

from services.dispatch.broker import DEFAULT_QUEUE, TASK_NAME, declare_queue, make_celery
from services.dispatch.redis_publish import RedisPublisher, is_redis_url
from services.settings import Settings

_apps: dict[str, Celery] = {}
_publishers: dict[str, RedisPublisher] = {}
_lock = threading.Lock()


def celery_app_for(settings: Settings) -> Celery:
    """The cached publishing app for these settings (built once per broker URL)."""
    key = settings.broker_url
    app = _apps.get(key)
    if app is None:
        with _lock:
            app = _apps.get(key)
            if app is None:
                app = _apps[key] = make_celery(settings)
    return app


def enqueue_job(
    settings: Settings, job_id: str, queue: str | None = None, priority: int | None = None
) -> None:
    """Publish ``accum.run_job(job_id)`` on ``queue`` (the spec's GPU class; default ``default``)
    at the job's stored ``priority`` (Redis delivers higher first; default normal).

    The queue is declared explicitly here, so a job routed to a GPU class with no worker yet
    waits in its queue until a worker started with ``--queues <name>`` comes up.
    """
    name = queue or DEFAULT_QUEUE
    if is_redis_url(settings.broker_url):
        publisher_for(settings).publish(TASK_NAME, [str(job_id)], name, priority)
        return
    celery_app_for(settings).send_task(
        TASK_NAME, args=[str(job_id)], queue=declare_queue(name), routing_key=name
    )


def publisher_for(settings: Settings) -> RedisPublisher:
    """The cached Redis publisher for these settings' broker URL."""
    key = settings.broker_url
    publisher = _publishers.get(key)
    if publisher is None:
        app = celery_app_for(settings)
        with _lock:
            publisher = _publishers.get(key)
            if publisher is None:
                publisher = _publishers[key] = RedisPublisher(app, key)
    return publisher


def reset_enqueue_cache() -> None:
    """Close cached broker connections (tests, and processes that fork after enqueueing)."""
    with _lock:
        for publisher in _publishers.values():
            publisher.close()
        _publishers.clear()
        for app in _apps.values():
            app.close()
        _apps.clear()
