"""Send a job's nudge to the workers: ``enqueue_job(settings, job_id, queue)``, the one path.

Called by the API after the transaction that created (or re-queued) the job has committed, by
the lease reaper, and by a worker handing its job back. Torch-free and cheap: one Celery app
per broker URL, reused across calls (its producer pool keeps the broker connection open), and
Celery's own ``send_task``: no hand-built message to keep in step with kombu's
(bench/enqueue.py and docs/benchmarks.md give the cost against a hand-built LPUSH).
"""

from __future__ import annotations

import threading

from celery import Celery

from services.dispatch.broker import DEFAULT_QUEUE, TASK_NAME, declare_queue, make_celery
from services.settings import Settings

_apps: dict[str, Celery] = {}
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


def enqueue_job(settings: Settings, job_id: str, queue: str | None = None) -> None:
    """Publish ``accum.run_job(job_id)`` on ``queue`` (the spec's GPU class; default ``default``).

    The queue is declared explicitly here, so a job routed to a GPU class with no worker yet
    waits in its queue until a worker started with ``--queues <name>`` comes up.
    """
    name = queue or DEFAULT_QUEUE
    celery_app_for(settings).send_task(
        TASK_NAME, args=[str(job_id)], queue=declare_queue(name), routing_key=name
    )


def reset_enqueue_cache() -> None:
    """Close cached broker connections (tests, and processes that fork after enqueueing)."""
    with _lock:
        for app in _apps.values():
            app.close()
        _apps.clear()
