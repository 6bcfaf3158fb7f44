"""Send a job's nudge to the workers: ``enqueue_job(settings, job_id, queue)``.

Called by the API after the transaction that created (or re-queued) the job has committed,
and by the lease reaper. Torch-free and cheap: one Celery app (and its producer pool) per
broker configuration, reused across calls.
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

_apps: dict[str, Celery] = {}
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


def enqueue_job(settings: Any, job_id: str, queue: str | None = None) -> None:
    """Publish ``accum.run_job(job_id)`` on ``queue`` (the spec's GPU class; default ``default``).

    The queue is declared explicitly here, so a job routed to a GPU class with no worker yet
    waits in its queue until a worker started with ``--queues <name>`` comes up.
    """
    app = celery_app_for(settings)
    name = queue or DEFAULT_QUEUE
    app.send_task(TASK_NAME, args=[str(job_id)], queue=declare_queue(name), routing_key=name)


def reset_enqueue_cache() -> None:
    """Close cached broker connections (tests, and processes that fork after enqueueing)."""
    with _lock:
        for app in _apps.values():
            app.close()
        _apps.clear()
