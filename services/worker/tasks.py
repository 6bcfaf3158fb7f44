"""The one Celery task: ``accum.run_job(job_id)``. It hands the id to the runner, nothing else.

    register_tasks(app, settings)   # on an app from services.dispatch.broker.make_celery

The runner (and with it torch) is imported inside the task: ``start_worker`` imports this
module before it pins the worker's GPUs (``--gpus`` sets CUDA_VISIBLE_DEVICES), and
``accum worker``'s CLI process imports it too.
"""

from __future__ import annotations

from celery import Celery, Task
from celery.exceptions import Reject
from sqlalchemy.exc import InterfaceError, OperationalError

from services.dispatch.broker import TASK_NAME
from services.settings import Settings
from services.worker import shutdown
from services.worker.process_death import request_class

# The database being unreachable is the one transient error: the runner records every other
# failure on the job itself. Retrying is safe: the claim drops the message if the job has
# moved on (and a job left running is recovered by the lease reaper).
DB_RETRY_COUNTDOWN_S = 5
DB_MAX_RETRIES = 120


def register_tasks(app: Celery, settings: Settings) -> None:
    """Bind ``accum.run_job`` to ``app``; the task runs jobs with these ``settings``."""

    # The request class runs in the worker's main process: it records how a prefork child
    # running a job died (services.worker.process_death).
    @app.task(name=TASK_NAME, bind=True, ignore_result=True, max_retries=DB_MAX_RETRIES,
              Request=request_class(settings))
    def run_job(task: Task, job_id: str) -> None:
        # Lazy: keeps torch out of the worker process until a job runs (see the docstring).
        from services.worker.runner import run_job as run

        if shutdown.requested.is_set():
            # A message taken between the signal and the exit (maybe the hand-back's own):
            # back to the queue for another worker, rather than claimed and handed back again.
            raise Reject("this worker is shutting down", requeue=True)
        try:
            with shutdown.stop_job_on_sigterm():
                run(settings, job_id, worker_name=str(task.request.hostname or ""))
        except (OperationalError, InterfaceError) as exc:
            raise task.retry(exc=exc, countdown=DB_RETRY_COUNTDOWN_S) from exc
        finally:
            if shutdown.abandoned.is_set():
                stop_consuming()


def stop_consuming() -> None:
    """This process left a hung job's training thread behind (``shutdown.abandoned``): it
    takes no other job. Celery stops consuming once this task is acknowledged, as after a warm
    shutdown (a prefork child ends after its one job anyway), and ``start_worker`` exits."""
    from celery.worker import state

    state.should_stop = shutdown.EXIT_ABANDONED
