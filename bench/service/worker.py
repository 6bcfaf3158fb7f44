"""Worker figures, one JSON object on stdout.

    .venv/bin/python -m bench.service.worker [--quick] [--jobs 20] [--brokers sqlite,redis]

1. Queue-to-running latency on an idle, warm worker: p50 over ``--jobs`` jobs of
   ``started_at - created_at`` (created_at is stamped before the job is committed and
   enqueued; started_at by the worker's claim, before the model is built). Measured for the
   embedded SQLite broker (SQLite database) and for Redis (PostgreSQL database) when reachable.
   Target p50 <= 100 ms.
2. Training throughput through the worker / ``Trainer.fit`` called directly on the same spec
   and objects (``services.worker.build.build_run``), measured as optimizer steps per second
   between the first and the last step (the worker's from the ``ts`` of its step metrics, so
   the metric batching and the heartbeat are inside the interval). Interleaved pairs (who
   goes first alternates), median of the per-pair ratios. Target >= 0.99.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness.common import base_parser, emit, machine, verdict

ROOT = Path(__file__).resolve().parents[2]

POSTGRES_ADMIN = os.environ.get("ACCUM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("ACCUM_TEST_REDIS_URL", "redis://127.0.0.1:6379") + "/11"
LATENCY_SPEC = {"model": "mlp", "dataset": "digits", "micro_batch_size": 16, "accumulation_steps": 1,
                "max_steps": 1, "optimizer": {"name": "sgd", "lr": 0.1}, "gpus": 0,
                "checkpoint_every": 1000}


def throughput_spec(steps: int, gpus: int) -> dict[str, Any]:
    return {"model": "mlp", "dataset": "digits", "micro_batch_size": 128,
            "accumulation_steps": 4, "max_steps": steps, "optimizer": {"name": "sgd", "lr": 0.05},
            "gpus": gpus, "checkpoint_every": 100_000, "seed": 3}


class Deployment:
    """A database + broker + one warm worker process, torn down on exit."""

    def __init__(self, kind: str, threads: int, env: dict[str, str] | None = None) -> None:
        from services.jobdb.migrate import upgrade
        from services.settings import Settings

        self.kind = kind
        self.tmp = Path(tempfile.mkdtemp(prefix=f"accum-bench-{kind}-"))
        self.queue = f"bench-{uuid.uuid4().hex[:8]}"
        self.pg_name: str | None = None
        if kind == "sqlite":
            self.settings = Settings(home=self.tmp)
        else:
            self.pg_name = f"accum_bench_{uuid.uuid4().hex[:8]}"
            self._pg_admin(f'CREATE DATABASE "{self.pg_name}"')
            db = POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + self.pg_name
            self.settings = Settings(home=self.tmp, database_url=db, broker_url=REDIS)
        upgrade(self.settings.database_url)
        env = dict(os.environ, ACCUM_HOME=str(self.tmp), ACCUM_DATABASE_URL=self.settings.database_url,
                   ACCUM_BROKER_URL=self.settings.broker_url, OMP_NUM_THREADS=str(threads),
                   ACCUM_ALLOW_ROOT="1", **(env or {}))  # a throwaway worker, also where benches run as root
        self.log = open(self.tmp / "worker.log", "wb")  # noqa: SIM115 - closed in close()
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "services.worker", "--queues", self.queue, "--loglevel", "WARNING"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.owner: Any = None

    def _pg_admin(self, sql: str) -> None:
        from sqlalchemy import create_engine, text

        engine = create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(sql))
        engine.dispose()

    def submit(self, spec: dict[str, Any]) -> str:
        from services.dispatch.enqueue import enqueue_job
        from services.jobdb import jobs, tokens
        from services.jobdb.sessions import session_factory
        from services.spec import parse_spec, total_optimizer_steps

        parsed = parse_spec({**spec, "queue": self.queue})
        with session_factory(self.settings).begin() as session:
            if self.owner is None:
                self.owner, _ = tokens.create_owner_with_token(session, "bench")
            job, _ = jobs.create_job(session, owner=self.owner, spec=parsed.normalised(), queue=self.queue,
                                     total_optimizer_steps=total_optimizer_steps(parsed))
        enqueue_job(self.settings, job.id, self.queue)
        return str(job.id)

    def wait(self, job_id: str, timeout: float = 600, poll_s: float = 0.01) -> Any:
        """Poll until the job ends. Poll slowly while timing throughput: on a small machine a
        busy poller steals the CPU that the worker's torch threads wait for."""
        from services.jobdb import jobs
        from services.jobdb.sessions import session_factory
        from services.jobdb.status import FINISHED

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with session_factory(self.settings)() as session:
                job = jobs.load_job(session, job_id)
                if job is not None and job.status in FINISHED:
                    if job.status != "succeeded":
                        raise RuntimeError(f"bench job {job_id} {job.status}: {job.error}")
                    return job
            if self.worker.poll() is not None:
                raise RuntimeError(f"worker exited: {(self.tmp / 'worker.log').read_text()[-3000:]}")
            time.sleep(poll_s)
        raise TimeoutError(f"bench job {job_id} did not finish in {timeout}s")

    def step_rate(self, job_id: str) -> float:
        from services.jobdb import metrics
        from services.jobdb.sessions import session_factory

        with session_factory(self.settings)() as session:
            rows, _ = metrics.read_metrics(session, job_id, name="loss", limit=1_000_000)
        span = (rows[-1].ts - rows[0].ts).total_seconds()
        return (rows[-1].step - rows[0].step) / span

    def close(self) -> None:
        from services.dispatch.enqueue import reset_enqueue_cache

        self.worker.send_signal(signal.SIGTERM)
        try:
            self.worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.worker.kill()
        self.log.close()
        reset_enqueue_cache()
        if self.pg_name:
            self._pg_admin(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')


def reachable(host: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), 1):
            return True
    except OSError:
        return False


def latency(deployment: Deployment, jobs: int) -> dict[str, Any]:
    deployment.wait(deployment.submit(LATENCY_SPEC), timeout=900)  # warm: torch imported, DB pools open
    samples = []
    for _ in range(jobs):
        job = deployment.wait(deployment.submit(LATENCY_SPEC))
        samples.append((job.started_at - job.created_at).total_seconds() * 1000)
    return {"p50_ms": statistics.median(samples), "max_ms": max(samples),
            "samples_ms": [round(s, 2) for s in samples]}


def direct_step_rate(spec: dict[str, Any]) -> float:
    """Steps/s of Trainer.fit on the objects the worker builds, first to last step."""
    from accumcore import Callback
    from services.spec import parse_spec
    from services.worker.build import build_run

    stamps: list[float] = []

    class Stamp(Callback):
        def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
            stamps.append(time.perf_counter())

    run = build_run(parse_spec(spec), callbacks=[Stamp()], checkpoint_dir=None)
    run.trainer.fit(run.train_loader, **run.fit_kwargs)
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def callback_overhead(settings: Any, spec: dict[str, Any]) -> dict[str, float]:
    """Share of ``Trainer.fit``'s wall time spent in the worker's StoreCallback (metric
    batching, progress, flushes to the real store), measured inside one run: a figure that
    load from other processes cannot skew the way it skews a ratio of two runs."""
    from services.jobdb import jobs, leases, tokens
    from services.jobdb.sessions import session_factory
    from services.spec import parse_spec, total_optimizer_steps
    from services.worker.build import build_run
    from services.worker.callbacks import StoreCallback

    parsed = parse_spec(spec)
    sessions = session_factory(settings)
    with sessions.begin() as session:
        owner, _ = tokens.create_owner_with_token(session, f"bench-{uuid.uuid4().hex[:6]}")
        job, _ = jobs.create_job(session, owner=owner, spec=parsed.normalised())
        leases.claim_job(session, job.id, "bench", "bench", "cpu", lease_timeout_s=3600)
    spent = [0.0]

    class Timed(StoreCallback):
        def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
            start = time.perf_counter()
            super().on_step(trainer, metrics)
            spent[0] += time.perf_counter() - start

        def on_fit_end(self, trainer: Any, history: Any) -> None:
            start = time.perf_counter()
            super().on_fit_end(trainer, history)
            spent[0] += time.perf_counter() - start

    callback = Timed(sessions, job.id, 1, "bench", total_optimizer_steps(parsed), 3)
    run = build_run(parsed, callbacks=[callback], checkpoint_dir=None)
    run.fit_kwargs["val_loader"] = None  # time the training loop, not evaluation
    run.fit_kwargs["eval_every"] = None
    start = time.perf_counter()
    run.trainer.fit(run.train_loader, **run.fit_kwargs)
    total = time.perf_counter() - start
    return {"fraction": spent[0] / total, "callback_s": spent[0], "fit_s": total,
            "flushes": float(callback.flushes)}


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per throughput run")
    parser.add_argument("--brokers", default="sqlite,redis")
    args = parser.parse_args()
    import torch

    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    jobs = 3 if args.quick else args.jobs
    steps = 20 if args.quick else args.steps
    repeats = 1 if args.quick else (args.repeats or 6)
    gpus = 1 if torch.cuda.is_available() else 0
    result: dict[str, Any] = {"machine": machine(), "torch_threads": threads}
    lat: dict[str, Any] = {}
    overhead: dict[str, float] = {}
    ratio_runs: dict[str, list[float]] = {"worker": [], "direct": []}
    for kind in args.brokers.split(","):
        if kind == "redis" and not (reachable("127.0.0.1", 6379) and reachable("127.0.0.1", 5432)):
            lat[kind] = {"skipped": "Redis or PostgreSQL not reachable on localhost"}
            continue
        deployment = Deployment(kind, threads)
        try:
            lat[kind] = latency(deployment, jobs)
            if kind == "sqlite":  # throughput: the embedded default, interleaved with direct fits
                spec = throughput_spec(steps, gpus)
                for i in range(repeats):  # alternate who goes first: load drifts over time
                    order = ("worker", "direct") if i % 2 == 0 else ("direct", "worker")
                    for side in order:
                        ratio_runs[side].append(
                            deployment.step_rate(deployment.wait(deployment.submit(spec), poll_s=0.5).id)
                            if side == "worker" else direct_step_rate(spec)
                        )
                overhead = callback_overhead(deployment.settings, spec)
        finally:
            deployment.close()
    p50s = [v["p50_ms"] for v in lat.values() if "p50_ms" in v]
    # Median of per-pair ratios: each pair ran back to back, under about the same load.
    pairs = [w / d for w, d in zip(ratio_runs["worker"], ratio_runs["direct"], strict=True)]
    ratio = statistics.median(pairs) if pairs else None
    result.update(
        figure="throughput through the worker / Trainer.fit (same spec)",
        target=0.99,
        measured=ratio,
        verdict=verdict(ratio, 0.99, higher_is_better=True),
        latency_target_ms=100,
        latency=lat,
        latency_verdict=verdict(max(p50s) if p50s else None, 100, higher_is_better=False),
        throughput_steps_per_s=ratio_runs,
        throughput_pair_ratios=[round(p, 4) for p in pairs],
        store_callback_overhead=overhead,
        store_callback_overhead_target="< 0.01 of fit time",
        throughput_spec=throughput_spec(steps, gpus),
    )
    emit("worker", result, args)


if __name__ == "__main__":
    main()
