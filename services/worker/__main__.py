"""Start a worker process: ``python -m services.worker --queues default --pool solo``.

The ``accum worker`` command does the same; settings come from ``ACCUM_*`` variables.
Pin a worker to its GPUs with ``CUDA_VISIBLE_DEVICES`` (or ``--gpus 0``): one worker per GPU.
"""

from __future__ import annotations

import argparse

from services.settings import get_settings
from services.worker.start import exit_worker_process, start_worker


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.worker", description=__doc__)
    parser.add_argument("--queues", default="default", help="comma-separated queue names")
    parser.add_argument("--hostname", default=None, help="Celery node name (default accum@host)")
    parser.add_argument("--pool", choices=("solo", "prefork"), default="solo")
    parser.add_argument("--gpus", default=None, help="sets CUDA_VISIBLE_DEVICES, e.g. 0 or 0,1")
    parser.add_argument("--cpu-ranks", type=int, default=None, metavar="K",
                        help="without GPUs: offer K CPU ranks (gloo) to gpus: k jobs (ACCUM_CPU_RANKS)")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    start_worker(
        get_settings(),
        queues=queues,
        hostname=args.hostname,
        pool=args.pool,
        gpus=args.gpus,
        loglevel=args.loglevel,
        cpu_ranks=args.cpu_ranks,
    )
    exit_worker_process(0)


if __name__ == "__main__":
    main()
