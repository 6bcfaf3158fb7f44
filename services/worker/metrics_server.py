"""The worker's own Prometheus endpoint: ``ACCUM_WORKER_METRICS_PORT`` (0, the default: off) on
``ACCUM_WORKER_METRICS_HOST``, serving ``services.worker.checkpoints.metrics`` at ``/metrics``.

    stop = serve_metrics(settings)   # in the worker's main process, before it forks or spawns
    ...
    if stop: stop()

A job's uploads run where the job runs: in this process (``--pool solo``), in a child forked
for each job (``--pool prefork``), or in a DDP job's rank 0, a spawned process. So the
instruments use prometheus_client's multiprocess mode: ``PROMETHEUS_MULTIPROC_DIR`` is set here
(a fresh directory, or the operator's own) before any instrument exists, every process that
inherits it writes its values to its own files there, and this endpoint sums the files of all
of them, finished children included (counters and histograms only, so nothing goes stale).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server, values
from prometheus_client.multiprocess import MultiProcessCollector

from services.settings import Settings
from services.worker.checkpoints import metrics as store_metrics

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def serve_metrics(settings: Settings) -> Callable[[], None] | None:
    """Start the endpoint when ``worker_metrics_port`` is set; returns what stops it (and removes
    the directory it made). Raises ``SystemExit`` with one line when the port cannot be bound."""
    if not settings.worker_metrics_port:
        return None
    own = os.environ.get(MULTIPROC_ENV) is None
    folder = Path(tempfile.mkdtemp(prefix="accum-worker-metrics-")) if own else Path(os.environ[MULTIPROC_ENV])
    os.environ[MULTIPROC_ENV] = str(folder)
    # Instruments made from now on (here and in children, which inherit both) write to files.
    values.ValueClass = values.get_value_class()
    store_metrics.instruments.cache_clear()
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))
    host, port = settings.worker_metrics_host, settings.worker_metrics_port
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if own:
            shutil.rmtree(folder, ignore_errors=True)
        raise SystemExit(
            f"accum worker: cannot serve metrics on {host}:{port} ({exc.strerror or exc}); set "
            "ACCUM_WORKER_METRICS_PORT to a free port, or to 0 to turn the endpoint off"
        ) from exc

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)
        if own:
            shutil.rmtree(folder, ignore_errors=True)
            del os.environ[MULTIPROC_ENV]
            values.ValueClass = values.get_value_class()
            store_metrics.instruments.cache_clear()

    return stop
