"""The Celery app is configured for long GPU jobs, registers no task by being built, and the
enqueue path stays torch-free."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kombu import Connection

from services.dispatch.broker import TASK_NAME, VISIBILITY_TIMEOUT_S, make_celery
from services.dispatch.enqueue import enqueue_job, reset_enqueue_cache
from services.settings import Settings
from services.worker.tasks import register_tasks


def test_long_job_settings(tmp_path: Path) -> None:
    app = make_celery(Settings(home=tmp_path), queues=["a100", "h100"])
    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1 and conf.worker_concurrency == 1
    assert conf.task_create_missing_queues is False
    assert [q.name for q in conf.task_queues] == ["a100", "h100"]
    assert conf.broker_transport_options["visibility_timeout"] == VISIBILITY_TIMEOUT_S >= 24 * 3600
    assert conf.broker_transport_options["polling_interval"] <= 0.05  # embedded broker
    assert conf.worker_enable_remote_control is False
    assert TASK_NAME not in app.tasks  # a publisher needs only the name
    register_tasks(app, Settings(home=tmp_path))
    assert TASK_NAME in app.tasks  # the worker registers it


def test_redis_broker_is_used_as_given(tmp_path: Path) -> None:
    app = make_celery(Settings(home=tmp_path, broker_url="redis://127.0.0.1:6379/3"))
    assert app.conf.broker_url == "redis://127.0.0.1:6379/3"
    assert "polling_interval" not in app.conf.broker_transport_options
    assert app.conf.worker_enable_remote_control is True


def test_enqueue_puts_the_job_id_on_the_named_queue(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    try:
        enqueue_job(settings, "job-1", "a100")
        enqueue_job(settings, "job-2", "a100")
        enqueue_job(settings, "job-3", "default")
    finally:
        reset_enqueue_cache()
    app = make_celery(settings, queues=["a100"])
    with Connection(settings.broker_url) as conn:
        queue = app.conf.task_queues[0](conn.default_channel)
        bodies = [queue.get(no_ack=True) for _ in range(3)]
    assert [b.headers["task"] for b in bodies[:2]] == [TASK_NAME, TASK_NAME]
    assert [b.decode()[0] for b in bodies[:2]] == [["job-1"], ["job-2"]]
    assert bodies[2] is None  # job-3 went to "default"


def test_enqueue_and_reaper_do_not_import_torch() -> None:
    code = (
        "import sys; import services.dispatch.enqueue, services.housekeeping.reaper, "
        "services.worker.start, services.worker.tasks; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
