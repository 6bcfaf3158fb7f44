"""Run a worker in this process, blocking: ``start_worker(settings, queues=["default"])``.

Used by ``accum worker``, ``accum up`` and ``python -m services.worker``. Besides consuming
jobs, every worker runs a lease reaper, so a job whose worker died is re-queued even when no
API process is up.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from celery import signals
from celery.utils.nodenames import default_nodename, host_format
from pydantic import ValidationError

from services.artifacts.probe import startup_check
from services.dispatch import sqlite_transport
from services.dispatch.broker import DEFAULT_QUEUE, is_embedded_broker, make_celery
from services.housekeeping.reaper import LeaseReaper
from services.settings import Settings
from services.worker import shutdown
from services.worker.cache_sweep import sweep_deleted_jobs
from services.worker.checkpoints.stores import artifact_store
from services.worker.metrics_server import serve_metrics
from services.worker.registry import Registration, describe
from services.worker.tasks import register_tasks

log = logging.getLogger(__name__)


def default_hostname() -> str:
    return f"accum-{os.getpid()}@{socket.gethostname()}"


def start_worker(
    settings: Settings,
    queues: Sequence[str] | None = None,
    hostname: str | None = None,
    pool: Literal["solo", "prefork"] = "solo",
    gpus: str | None = None,
    loglevel: str = "INFO",
    preload: bool = True,
    cpu_ranks: int | None = None,
) -> None:
    """Consume ``queues`` until SIGTERM/SIGINT (warm shutdown: the running job stops at its
    next micro-batch, is checkpointed at its last finished window and handed back to the
    queue, for another worker to resume).

    Args:
        settings: ``services.settings.Settings``.
        queues: GPU-class queues to consume (default ``["default"]``).
        hostname: Celery node name; it is recorded on the job as the worker that ran it.
        pool: ``solo`` runs the job in this process (default, one GPU per worker process);
            ``prefork`` runs each job in a fresh child (``worker_max_tasks_per_child=1``).
        gpus: pins this worker to GPUs by setting ``CUDA_VISIBLE_DEVICES`` before anything
            imports torch, e.g. ``"0"``, or ``"0,1"`` for a worker that runs 2-GPU jobs.
        loglevel: Celery's log level.
        preload: import torch and the runner before consuming (a warm first job).
        cpu_ranks: replaces ``settings.cpu_ranks`` (``ACCUM_CPU_RANKS``): the CPU ranks (gloo)
            a worker without GPUs offers ``gpus: k`` jobs, registered with its CPU device.
    """
    settings = checked_settings(settings, pool, cpu_ranks)
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    names = list(queues or [DEFAULT_QUEUE])
    # The node name as Celery expands it: what tasks see as their hostname and record on jobs.
    nodename = host_format(default_nodename(hostname or default_hostname()))
    try:  # what it registers, --cpu-ranks checked against its devices before it consumes
        description = describe(nodename, names, settings.cpu_ranks)
    except ValueError as exc:
        raise SystemExit(f"accum worker: {exc}") from exc
    # Before anything forks or spawns: children inherit the metrics' multiprocess directory.
    stop_metrics = serve_metrics(settings)
    app = make_celery(settings, queues=names)
    register_tasks(app, settings)
    if preload:
        preload_runner(pool)
    if pool == "solo":
        # One tracker host for every job of this worker, started by the first that logs to a
        # tracker (a prefork child, gone after its job, starts one of its own per attempt).
        from services.worker.trackers.handover import share_host

        share_host()
    connect_stop_signals()
    reaper = LeaseReaper(settings, queues=names)
    reaper.start()
    unregister = register_when_ready(settings, nodename, names, description)
    log.info("accum worker %s consuming %s from %s", nodename, ",".join(names), settings.broker_url)
    try:
        consume(app, nodename, pool, names, loglevel, embedded=is_embedded_broker(settings.broker_url))
    finally:
        unregister()
        reaper.stop()
        if stop_metrics is not None:
            stop_metrics()
    if shutdown.abandoned.is_set():
        # A hung job's training thread is still in this process (services.worker.pulse): its
        # job is recorded and resumes elsewhere; the process exits at once, not waiting on the
        # thread, and its supervisor (docker's restart policy, systemd) starts a fresh one.
        log.error("accum worker %s: a hung job's training thread is left in this process: "
                  "exiting with code %d", nodename, shutdown.EXIT_ABANDONED)
        exit_worker_process(shutdown.EXIT_ABANDONED)


def checked_settings(settings: Settings, pool: str, cpu_ranks: int | None) -> Settings:
    """The settings this worker runs with, refused now where every job would fail."""
    if pool not in ("solo", "prefork"):
        raise ValueError(f"pool must be 'solo' or 'prefork', got {pool!r}")
    refuse_root(settings)
    if cpu_ranks is not None:
        settings = with_cpu_ranks_setting(settings, cpu_ranks)
    # A worker that cannot write its checkpoints would fail every job it takes: refuse now.
    refusal = startup_check(artifact_store(settings))
    if refusal is not None:
        raise SystemExit(refusal)
    return settings


def refuse_root(settings: Settings, euid: int | None = None) -> None:
    """A worker runs its jobs' code (models, plugins, ``hf:`` loaders) and reads the paths they
    name: as root, a job could read or write anything on the node, and its errors showed root's
    own paths. Refused unless ``ACCUM_ALLOW_ROOT=1`` says so; the Docker image runs as ``accum``."""
    euid = os.geteuid() if euid is None and hasattr(os, "geteuid") else euid
    if euid == 0 and not settings.allow_root:
        raise SystemExit(
            "accum worker: refusing to run as root: every job's code would run with root's "
            "rights on this node. Start it as an unprivileged user (e.g. `sudo -u accum accum "
            "worker ...`; the Docker image runs as `accum`), or set ACCUM_ALLOW_ROOT=1 to run "
            "it as root anyway."
        )


def preload_runner(pool: str = "solo") -> None:
    """Import torch and the runner now, in this idle parent, so the first job does not pay for
    it (queue-to-running latency). Importing torch does not initialise CUDA, so a prefork pool
    still forks a CUDA-free parent. Lazy, not at the top: torch stays out until --gpus has
    pinned CUDA_VISIBLE_DEVICES.

    The built-in catalog's builders too (torchvision with them: 0.5-1.7 s the first job's build
    paid, issue 45): in a thread beside the start-up for ``solo`` (the worker registers as
    soon as it consumes; a job that comes first waits on the same imports), here for
    ``prefork``, whose children must be forked from a parent without a thread mid-import."""
    import services.worker.runner  # noqa: F401  (and rank, launch)

    if pool == "prefork":
        import_builders()
    else:
        threading.Thread(target=import_builders, name="accum-preload", daemon=True).start()


def import_builders() -> None:
    import services.catalog.builders.datasets  # noqa: F401
    import services.catalog.builders.models  # noqa: F401


def connect_stop_signals() -> None:
    """SIGTERM/SIGINT: an idle embedded-broker consumer stops polling at once (Redis's event
    loop already wakes within a second), and a running job stops, is checkpointed and goes
    back to the queue."""
    sqlite_transport.resume_polling()
    signals.worker_shutting_down.connect(sqlite_transport.stop_polling, weak=False)
    shutdown.connect(signals)


def register_when_ready(settings: Settings, nodename: str, names: list[str],
                        description: dict[str, Any]) -> Callable[[], None]:
    """Register the worker once it consumes (listed idle only when it can take a job); its
    beat also drops the node cache's files of deleted jobs. Returns what unregisters it."""
    registration = Registration(settings, nodename, names, description,
                                on_beat=lambda: sweep_deleted_jobs(settings))

    def register(**_: Any) -> None:
        registration.start()

    signals.worker_ready.connect(register, weak=False)

    def unregister() -> None:
        signals.worker_ready.disconnect(register)
        registration.stop()

    return unregister


def consume(app: Any, nodename: str, pool: str, names: list[str], loglevel: str, *, embedded: bool) -> None:
    """Run Celery's worker in this process until it is stopped: one job at a time."""
    worker = app.Worker(
        hostname=nodename,
        pool=pool,
        concurrency=1,
        queues=names,
        loglevel=loglevel,
        # Gossip and mingle only sync Celery's own cluster state, which we do not use, and
        # they cost start-up time; the embedded broker has no fanout for them anyway.
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=embedded,
        optimization="fair",
    )
    worker.start()


def with_cpu_ranks_setting(settings: Settings, cpu_ranks: int) -> Settings:
    """``settings`` with ``cpu_ranks`` checked against the setting's own bounds."""
    try:
        return Settings.model_validate({**settings.model_dump(), "cpu_ranks": cpu_ranks})
    except ValidationError as exc:  # the field's bound, in pydantic's words
        reason = exc.errors()[0]["msg"][0].lower() + exc.errors()[0]["msg"][1:]
        raise SystemExit(f"accum worker: --cpu-ranks {cpu_ranks}: {reason} (0: no CPU ranks)") from exc


def exit_worker_process(code: int = 0) -> None:
    """End a process that only ran ``start_worker``, skipping the interpreter's teardown.

    After a job has run, freeing torch's and the catalog's objects one by one at exit took
    about a second of CPU (more on a loaded machine) for nothing: the job store holds all
    state, database connections close with the process, and logs are flushed here first.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
