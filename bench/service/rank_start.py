"""What a ``gpus: 1`` job would pay to train in a spawned rank, as ``gpus: k`` jobs do, rather
than in the worker's process (issue 40: one supervisor for every world size).

    .venv/bin/python -m bench.service.rank_start [--quick] [--repeats 3] [--out]

The same 2-step digits job (the job_start spec, ``max_steps: 2``), run by ``runner.run_job``
on a scratch SQLite store, alternately (a) as today, in this process, and (b) through
``distributed.spawn_ranks`` in a world of 1 (one spawned rank, a gloo group of one, the
supervisor of ``gpus: k``). Per run: wall seconds and CPU seconds of this process and its
children (``RUSAGE_CHILDREN``: the spawned rank's torch import, its build). A warm-up run of
each first; medians over the repeats. The extra cost per job, times the ``gpus: 1`` jobs a
test run starts, is what moving them would add to the suite. ``--quick`` (the smoke test):
one run of each, no warm-up.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness.common import base_parser, configure, emit, machine

SPEC: dict[str, Any] = {"model": "small_cnn", "dataset": "digits", "micro_batch_size": 16,
                        "accumulation_steps": 4, "max_steps": 2, "checkpoint_every": 50,
                        "optimizer": {"name": "sgd", "lr": 0.1}, "gpus": 0}


def cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def spawned() -> Iterator[None]:
    """``launch`` sends a world of 1 through ``spawn_ranks`` (the gpus: k path) for the block."""
    from services.worker import launch
    from services.worker.distributed import spawn_ranks

    def through_spawn(settings: Any, spec: Any, attempt: Any, heartbeat: Any, gang: Any = None) -> Any:
        checkpoint = launch.prepare_resume(launch.session_factory(settings), attempt,
                                           launch.artifact_store(settings), launch.node_cache(settings))
        return spawn_ranks(settings, spec, attempt, heartbeat, checkpoint)

    original = launch.launch
    import services.worker.runner as runner

    runner.launch = through_spawn  # type: ignore[assignment]
    try:
        yield
    finally:
        runner.launch = original


def one(home: Path, way: str) -> tuple[float, float]:
    from services.jobdb import jobs, tokens
    from services.jobdb.migrate import upgrade
    from services.jobdb.sessions import session_factory
    from services.settings import Settings
    from services.worker.runner import run_job

    settings = Settings(home=home, lease_timeout_s=10, heartbeat_interval_s=1, cpu_ranks=2)
    upgrade(settings.database_url)
    with session_factory(settings).begin() as session:
        owner, _ = tokens.create_owner_with_token(session, f"bench-{way}-{home.name}")
        job_id = jobs.create_job(session, owner=owner, spec=SPEC, queue="default")[0].id
    started, cpu = time.monotonic(), cpu_s()
    with spawned() if way == "spawned" else contextlib.nullcontext():
        outcome = run_job(settings, job_id, "bench")
    assert outcome == "succeeded", outcome
    return time.monotonic() - started, cpu_s() - cpu


def main() -> None:
    parser = base_parser(__doc__ or "")
    args = parser.parse_args()
    configure(args)
    repeats = 1 if args.quick else (args.repeats or 3)
    runs: dict[str, list[tuple[float, float]]] = {"in_process": [], "spawned": []}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(repeats + (0 if args.quick else 1)):  # the first round warms both up
            for way in runs:
                figure = one(Path(scratch) / f"{way}-{index}", way)
                if args.quick or index:
                    runs[way].append(figure)
    medians = {way: {"wall_s": round(statistics.median(f[0] for f in figures), 3),
                     "cpu_s": round(statistics.median(f[1] for f in figures), 3)}
               for way, figures in runs.items()}
    extra = round(medians["spawned"]["cpu_s"] - medians["in_process"]["cpu_s"], 3)
    emit("rank_start", {
        "machine": machine(), "load_start": load_start, "repeats": repeats,
        "figure": "2-step gpus: 1 job: CPU-s a spawned rank adds over training in the worker's process",
        "target": "(decides the path)", "measured": extra, "verdict": "-", "figures": medians,
    }, args)


if __name__ == "__main__":
    main()
