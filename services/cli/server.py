"""Server commands: `accum up` (API + worker, local), `accum api`, `accum worker`.

    accum up [--host 127.0.0.1] [--port 8000]   # embedded: SQLite database and broker
    accum api --host 0.0.0.0 --port 8000        # API only (production: behind compose)
    accum worker --queues default --gpus 0      # one worker per GPU
    accum worker --cpu-ranks 2                  # no GPU: gpus: 2 jobs on 2 CPU ranks (gloo)
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# On SIGTERM the API stops accepting connections and lets in-flight requests finish; what
# still runs after this long (a live event stream) is cut. Below Docker's default 10 s stop
# timeout, so a drained API exits on its own before it would be SIGKILLed.
GRACEFUL_SHUTDOWN_S = 8.0


def register(commands: Any) -> None:
    up = commands.add_parser("up", help="run the local service (API + one worker) in the foreground")
    api = commands.add_parser("api", help="run the API server (uvicorn)")
    for sub in (up, api):
        sub.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST}")
        sub.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    up.add_argument("--log-dir", type=Path,
                    help="where the API's and the worker's logs go (default ACCUM_HOME/logs)")
    up.add_argument("--verbose", action="store_true",
                    help="print the API's and the worker's logs here (access lines, Celery's)")
    up.set_defaults(func=cmd_up)
    api.add_argument("--log-level", default="info")
    api.add_argument(
        "--timeout-graceful-shutdown", type=float, default=GRACEFUL_SHUTDOWN_S, metavar="S",
        help=f"on SIGTERM, seconds in-flight requests get to finish (default {GRACEFUL_SHUTDOWN_S:g})",
    )
    api.set_defaults(func=cmd_api)

    worker = commands.add_parser("worker", help="run a Celery worker that trains jobs")
    worker.add_argument("--queues", default="default", help="comma-separated GPU-class queues")
    worker.add_argument(
        "--hostname", help="worker node name, recorded on the jobs it runs; %%h = host name"
    )
    worker.add_argument("--pool", choices=("solo", "prefork"), default="solo")
    worker.add_argument("--gpus", help="pin to these GPUs (sets CUDA_VISIBLE_DEVICES), e.g. 0")
    for sub in (up, worker):
        sub.add_argument(
            "--cpu-ranks", type=int, metavar="K",
            help="a node without GPUs: offer K CPU ranks (gloo) to `gpus: k` jobs, k <= K, "
            "registered in GET /v1/workers (ACCUM_CPU_RANKS; default 0: one process per job)",
        )
    worker.add_argument("--loglevel", default="INFO")
    worker.set_defaults(func=cmd_worker)


def cmd_up(args: argparse.Namespace) -> int:
    from accum.config import local_config_path, user_config_path
    from services.cli.admin import redacted
    from services.cli.common import require_worker_extra
    from services.cli.local import (
        LocalService,
        LocalServiceError,
        Terminated,
        sigterm_as_exception,
    )
    from services.settings import get_settings

    require_worker_extra()  # its worker trains
    settings = get_settings()
    # Quiet by default: the token and the URL are what a person needs from this terminal; the
    # children's banners, access lines (the dashboard polls) and task lines go to files.
    log_dir = None if args.verbose else (args.log_dir or Path(settings.home) / "logs")
    service = LocalService(settings, host=args.host, port=args.port, log_dir=log_dir,
                           cpu_ranks=args.cpu_ranks, record_for_user=True)
    with sigterm_as_exception():
        try:
            token = service.start()
            print(
                f"accum is up at {service.url}\n"
                f"  token:    {token}\n"
                f"  config:   {local_config_path(settings.home)} (the accum CLI reads it here)\n"
                f"            {user_config_path()} (from any other folder)\n"
                f"  database: {redacted(settings.database_url)}\n"
                f"  artifacts: {settings.artifacts_url}\n"
                + (f"  logs:     {log_dir} (accum up --verbose prints them here)\n" if log_dir else "")
                + "try: accum submit examples/digits_small_cnn.yaml --watch\n"
                "Ctrl-C stops the API and the worker.",
                flush=True,
            )
            service.wait()
        except LocalServiceError as exc:
            print(f"accum up: {exc}", file=sys.stderr)
            return 1
        except (KeyboardInterrupt, Terminated):
            print("\nstopping the API and the worker...", file=sys.stderr, flush=True)
        finally:
            service.stop()
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from services.api.main import create_app
    from services.settings import get_settings

    # uvicorn drains on SIGTERM, then raises the signal again, which would end a clean stop
    # as "killed by SIGTERM" (exit 143): exit 0 instead.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.run(
        create_app(get_settings()),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.timeout_graceful_shutdown,
        # uvicorn would believe X-Forwarded-For from 127.0.0.1 by default; the app reads it
        # itself, from ACCUM_FORWARDED_ALLOW_IPS only (ProxyHeadersMiddleware in services/api/main.py).
        proxy_headers=False,
    )
    return 0


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def cmd_worker(args: argparse.Namespace) -> int:
    from services.cli.common import require_worker_extra

    require_worker_extra()  # one line naming the extra, before the imports that load torch

    from celery.utils.nodenames import host_format

    from services.settings import get_settings
    from services.worker.start import exit_worker_process, start_worker

    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    start_worker(
        get_settings(),
        queues=queues,
        # `gpu0@%h` (as docker-compose.yml passes it) -> gpu0@<host name>, as celery's CLI does.
        hostname=host_format(args.hostname) if args.hostname else None,
        pool=args.pool,
        gpus=args.gpus,
        loglevel=args.loglevel,
        cpu_ranks=args.cpu_ranks,
    )
    exit_worker_process(0)
    return 0  # not reached: the process ends above
