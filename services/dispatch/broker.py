"""The Celery app's configuration, shared by the API (to publish) and the workers (to consume).

    app = make_celery(settings, queues=["default"])   # configured, with no task registered
    register_tasks(app, settings)                     # the worker's part (services.worker.tasks)

The broker only carries a nudge (a job id); the job row in the database is the source of
truth. So the settings below favour "a message is never dropped while its job runs" and leave
recovery of lost work to the database lease (``services.housekeeping.reaper``), not to the broker.
Building the app registers no task: a publisher needs only the task's name (``TASK_NAME``).
"""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery
from kombu import Exchange, Queue

from services.dispatch import sqlite_transport
from services.settings import Settings

TASK_NAME = "accum.run_job"
DEFAULT_QUEUE = "default"
# Longer than any job we expect to run: Redis re-delivers an unacknowledged message after this
# long, and with late acks a message stays unacknowledged for the whole job. A shorter value
# would hand a running 10-hour job to a second worker (which would then drop it, since the
# claim fails, but only after wasting a model build). Lost workers are found by the lease.
VISIBILITY_TIMEOUT_S = 7 * 24 * 3600

sqlite_transport.register()


def is_embedded_broker(url: str) -> bool:
    """The embedded SQLite broker: polled, no fanout exchanges, no worker heartbeats."""
    return url.startswith(f"{sqlite_transport.SCHEME}://")


def declare_queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def make_celery(settings: Settings, queues: Sequence[str] = (DEFAULT_QUEUE,)) -> Celery:
    """A Celery app configured for long, GPU-bound jobs (no task registered).

    Args:
        settings: reads ``broker_url`` (``Settings`` fills in the embedded broker's default).
        queues: the queues this process declares and, for a worker, consumes: one per GPU
            class (``default``, ``a100``, ...). The spec's ``queue`` routes a job to one.
    """
    url = settings.broker_url
    embedded = is_embedded_broker(url)
    names = list(dict.fromkeys(queues)) or [DEFAULT_QUEUE]
    app = Celery("accum", broker=url, set_as_current=False)
    app.conf.update(
        # Ack after the job ends, not when it starts: a worker that dies mid-job leaves the
        # message unacknowledged instead of silently consumed.
        task_acks_late=True,
        # ...and when the worker process is killed (OOM killer, kill -9), reject the message
        # rather than ack it, so the broker may hand it to another worker.
        task_reject_on_worker_lost=True,
        # A GPU worker runs one job at a time; prefetching a second message would park it
        # behind a job that may run for hours while another GPU sits idle.
        worker_prefetch_multiplier=1,
        # One process per GPU (pinned with CUDA_VISIBLE_DEVICES), so one task at a time.
        worker_concurrency=1,
        # A fresh child per job under the prefork pool: CUDA memory and allocator state are
        # returned to the driver when the job ends. Also keeps CUDA out of the forking parent.
        worker_max_tasks_per_child=1,
        # A prefork child that dies is reported after this wait for a result it may have sent
        # (10 s by default). Results live in the database, so 1 s: the worker records how the
        # child died (services.worker.process_death) well before its lease expires, and its
        # pool slot is free again sooner.
        worker_lost_wait=1.0,
        # Queues are a fixed, declared set (one per GPU class); a typo in a spec's `queue`
        # must fail loudly, not create a queue no worker listens to.
        task_create_missing_queues=False,
        task_queues=[declare_queue(n) for n in names],
        task_default_queue=names[0],
        task_routes={TASK_NAME: {"queue": names[0]}},
        # The database keeps results and progress; Celery's result backend would be a second,
        # divergent copy.
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        # A broker blip must not cancel a job that has trained for hours: the task keeps
        # running and its message is acknowledged (or re-delivered) once the broker is back.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": VISIBILITY_TIMEOUT_S,
            # The embedded broker is polled: 20 ms keeps queue-to-running latency in the tens
            # of milliseconds for a few cheap indexed queries per second.
            **({"polling_interval": sqlite_transport.DEFAULT_POLLING_INTERVAL_S} if embedded else {}),
        },
        # Remote control, gossip and mingle need fanout exchanges, which the embedded broker
        # does not have; the job store is the control plane anyway.
        worker_enable_remote_control=not embedded,
        worker_send_task_events=False,
        # Our logging setup stays in charge of the root logger.
        worker_hijack_root_logger=False,
    )
    return app
