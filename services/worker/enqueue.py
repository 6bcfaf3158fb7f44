"""Send a job's nudge to the workers: ``enqueue_job(settings, job_id, queue)``.

Called by the API after the transaction that created (or re-queued) the job has committed,
and by the lease reaper. Torch-free and cheap: one Celery app per broker configuration,
reused across calls; on Redis, messages go out through one shared, thread-safe client
(``redis_publish``) instead of Celery's per-publish client, the API's hot path.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery

from services.worker.app import (
    DEFAULT_QUEUE,
    TASK_NAME,
    broker_url,
    declare_queue,
    make_celery,
)
from services.worker.redis_publish import RedisPublisher, is_redis_url

_apps: dict[str, Celery] = {}
_publishers: dict[str, RedisPublisher] = {}
_lock = threading.Lock()


def celery_app_for(settings: Any) -> Celery:
    """The cached Celery app for these settings (built once per broker URL)."""
    key = broker_url(settings)
    app = _apps.get(key)
    if app is None:
        with _lock:
            app = _apps.get(key)
            if app is None:
                app = _apps[key] = make_celery(settings)
    return app


def enqueue_job(
    settings: Any, job_id: str, queue: str | None = None, priority: int | None = None
) -> None:
    """Publish ``accum.run_job(job_id)`` on ``queue`` (the spec's GPU class; default ``default``)
    at the job's stored ``priority`` (Redis delivers higher first; default normal).

    The queue is declared explicitly here, so a job routed to a GPU class with no worker yet
    waits in its queue until a worker started with ``--queues <name>`` comes up.
    """
    name = queue or DEFAULT_QUEUE
    url = broker_url(settings)
    if is_redis_url(url):
        publisher_for(settings).publish(TASK_NAME, [str(job_id)], name, priority)
        return
    app = celery_app_for(settings)
    app.send_task(TASK_NAME, args=[str(job_id)], queue=declare_queue(name), routing_key=name)


def publisher_for(settings: Any) -> RedisPublisher:
    """The cached Redis publisher for these settings' broker URL."""
    key = broker_url(settings)
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
