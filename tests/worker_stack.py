"""Real worker processes against real brokers and databases (the ``stack`` fixture).

Used by tests/integration and tests/reliability; tests/conftest.py makes the fixture visible
to every test directory.

``stack`` is one deployment: the embedded default (SQLite database + SQLite broker under a
fresh ACCUM_HOME) or PostgreSQL + Redis (this machine's services; a fresh database and a
queue name unique to this test session, so parallel runs do not take each other's jobs).
Workers are started as ``python -m services.worker`` subprocesses, as in production.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from services.artifacts import ArtifactStore, consolidated_key, is_sharded_key, open_store
from services.dispatch.enqueue import enqueue_job
from services.jobdb import checkpoints, events, jobs, metrics, tokens
from services.jobdb.migrate import upgrade
from services.jobdb.models import Job, Owner
from services.jobdb.sessions import session_factory
from services.jobdb.status import FINISHED
from services.settings import Settings
from services.spec import parse_spec, total_optimizer_steps

ROOT = Path(__file__).resolve().parents[1]
# Short leases so a killed worker's job is reaped within seconds (5 s leaves a loaded
# machine 4 missed heartbeats of slack before a live job would be taken over).
# A queued job with no message gets another one after 3 s (the lost-message rescue), short
# enough for a test, long enough that jobs queued behind others rarely get a duplicate.
TIMING = {
    "lease_timeout_s": 5.0,
    "heartbeat_interval_s": 1.0,
    "reaper_interval_s": 0.5,
    "requeue_after_s": 3.0,
}
BASE_SPEC: dict[str, Any] = {
    "model": "mlp",
    "dataset": "digits",
    "micro_batch_size": 16,
    "accumulation_steps": 2,
    "max_steps": 12,
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
    "checkpoint_every": 4,
    "keep_checkpoints": 2,
    "seed": 7,
    "gpus": 0,
}


@dataclass
class Stack:
    """One deployment under test, with helpers to submit jobs and run workers."""

    name: str
    settings: Settings
    queue: str
    logs: Path
    owner: Owner | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    hostnames: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def sessions(self) -> Any:
        return session_factory(self.settings)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            ACCUM_HOME=str(self.settings.home),
            ACCUM_DATABASE_URL=self.settings.database_url,
            ACCUM_BROKER_URL=self.settings.broker_url,
            ACCUM_LEASE_TIMEOUT_S=str(self.settings.lease_timeout_s),
            ACCUM_HEARTBEAT_INTERVAL_S=str(self.settings.heartbeat_interval_s),
            ACCUM_REAPER_INTERVAL_S=str(self.settings.reaper_interval_s),
            ACCUM_REQUEUE_AFTER_S=str(self.settings.requeue_after_s),
            ACCUM_POISON_AFTER_LOST_ATTEMPTS=str(self.settings.poison_after_lost_attempts),
            ACCUM_OOM_EVENTS_FILE=str(self.settings.oom_events_file),
            ACCUM_ARTIFACTS_URL=self.settings.artifacts_url,
            ACCUM_CACHE_DIR=str(self.settings.cache_path),
            # Tiny models on a shared 2-core machine: one thread each is faster and the same
            # in every worker, so results are bitwise comparable across workers.
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            # Tests run as root on the CI machine; a worker refuses root unless told (issue 42).
            ACCUM_ALLOW_ROOT="1",
        )
        return env

    def variant(self, tmp: Path, **settings: Any) -> Stack:
        """The same deployment on a queue of its own, with no workers yet and these settings
        changed (e.g. shorter leases, another ``artifacts_dir``) for the workers it starts."""
        logs = tmp / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if "artifacts_dir" in settings and "artifacts_url" not in settings:
            settings["artifacts_url"] = Path(settings["artifacts_dir"]).resolve().as_uri()
        return Stack(self.name, self.settings.model_copy(update=settings),
                     f"it-{uuid.uuid4().hex[:10]}", logs)

    def start_worker(self, pool: str = "solo", args: Sequence[str] = (), **env: str) -> subprocess.Popen[bytes]:
        """A ``python -m services.worker`` on this stack's queue; ``pool`` is its ``--pool``,
        ``args`` more options (``--cpu-ranks 2``), ``env`` variables set for it alone (another
        node: ``ACCUM_HOME``, ``ACCUM_CACHE_DIR``)."""
        index = len(self.workers)
        hostname = f"test-{self.name}-{index}-{uuid.uuid4().hex[:6]}@localhost"
        log = open(self.logs / f"worker-{index}.log", "wb")  # noqa: SIM115 - owned by the process
        process = subprocess.Popen(
            [sys.executable, "-m", "services.worker", "--queues", self.queue,
             "--hostname", hostname, "--pool", pool, "--loglevel", "INFO", *args],
            cwd=ROOT, env={**self.env(), **env}, stdout=log, stderr=subprocess.STDOUT,
        )
        self.workers.append(process)
        self.hostnames[hostname] = process
        return process

    def wait_ready(self, process: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
        """Until the worker consumes (Celery's "<hostname> ready." in its log): a node started
        on a loaded machine can take a minute to import torch, and a fault staged meanwhile
        (the store stopped) would hit its start-up check instead of the job under test."""
        hostname = next(name for name, started in self.hostnames.items() if started is process)
        log = self.logs / f"worker-{self.workers.index(process)}.log"
        deadline = time.monotonic() + timeout
        while f"{hostname} ready." not in log.read_text(errors="replace"):
            if process.poll() is not None:
                pytest.fail(f"worker {hostname} exited ({process.returncode}) before it was ready\n"
                            f"{self.worker_logs()}")
            assert time.monotonic() < deadline, f"worker {hostname} not ready after {timeout:g} s"
            time.sleep(0.2)

    def process_holding(self, job_id: str) -> subprocess.Popen[bytes]:
        """The worker process that holds the job's lease (lease_owner starts with its name)."""
        owner = self.job(job_id).lease_owner or ""
        for hostname, process in self.hostnames.items():
            if owner.startswith(hostname):
                return process
        raise AssertionError(f"no test worker holds job {job_id} (lease owner {owner!r})")

    def pool_child(self, job_id: str) -> int:
        """The pid of the prefork child running the job (the only child of the worker process
        that holds its lease: concurrency 1)."""
        pid = self.process_holding(job_id).pid
        # Each thread lists the children it forked (the pool's supervisor thread forks the
        # replacements of dead children).
        children = [child for thread in Path(f"/proc/{pid}/task").iterdir()
                    for child in (thread / "children").read_text().split()]
        assert len(children) == 1, f"worker {pid} has children {children}, expected one"
        return int(children[0])

    def stop_workers(self) -> None:
        # SIGTERM is Celery's warm shutdown; past a short grace period just kill (teardown only).
        for process in self.workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 3
        for process in self.workers:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def worker_logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in sorted(self.logs.glob("*.log"))
        )

    def create(self, enqueue: bool = True, **overrides: Any) -> str:
        spec = parse_spec({**BASE_SPEC, **overrides, "queue": self.queue})
        with self.sessions.begin() as session:
            if self.owner is None:
                self.owner, _ = tokens.create_owner_with_token(session, f"it-{uuid.uuid4().hex[:8]}")
            job, _ = jobs.create_job(
                session, owner=self.owner, spec=spec.normalised(), queue=self.queue,
                max_restarts=spec.max_restarts, total_optimizer_steps=total_optimizer_steps(spec),
            )
        if enqueue:
            enqueue_job(self.settings, job.id, self.queue)
        return job.id

    def resume(self, job_id: str) -> None:
        """``POST /v1/jobs/{id}/resume``: re-queue a failed or cancelled job and enqueue it."""
        with self.sessions.begin() as session:
            job = jobs.load_job(session, job_id)
            assert job is not None
            jobs.request_resume(session, job)
        enqueue_job(self.settings, job_id, self.queue)

    def job(self, job_id: str) -> Job:
        with self.sessions() as session:
            job = jobs.load_job(session, job_id)
            assert job is not None
            return job

    def metric_steps(self, job_id: str, name: str = "loss") -> list[tuple[int, int]]:
        """``(step, attempt)`` of the job's ``name`` metric rows, in step order."""
        with self.sessions() as session:
            rows, _ = metrics.read_metrics(session, job_id, name=name, limit=1_000_000)
        return [(r.step, r.attempt) for r in rows]

    def metric_steps_by_name(self, job_id: str) -> dict[str, list[int]]:
        """Every metric of the job: its name -> the steps of its rows, in order (a step lost or
        logged twice by a restart shows here; compare with an uninterrupted run's). System
        metrics are left out: sampled by the clock (every ACCUM_SYSTEM_METRICS_EVERY_S), they
        join whichever step is next, so their steps differ between any two runs."""
        from services.worker.system_metrics import HOST_NAMES, NAMES

        with self.sessions() as session:
            rows, _ = metrics.read_metrics(session, job_id, limit=1_000_000)
        steps: dict[str, list[int]] = {}
        for row in rows:
            if row.name not in (*HOST_NAMES, *NAMES):
                steps.setdefault(row.name, []).append(row.step)
        return steps

    def final_weights(self, job_id: str) -> dict[str, Any]:
        """The model tensors of the job's latest checkpoint (fetched from the artifact store)."""
        import torch  # lazily: most tests using this module never load a checkpoint

        with self.sessions() as session:
            kept = checkpoints.list_checkpoints(session, job_id)
        assert kept, f"job {job_id} has no checkpoint"
        key = kept[-1].key  # a sharded checkpoint's: its consolidated file (the row's sha256)
        key = consolidated_key(key) if is_sharded_key(key) else key
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "latest.pt"
            open_store(self.settings.artifacts_url).get(key, path, kept[-1].sha256)
            return dict(torch.load(path, weights_only=True)["model"])

    def served_by_an_api(self, job_id: str, home: Path) -> tuple[Any, Any, dict[str, Any]]:
        """What an API with its own home (no disk in common with any node) serves an admin for
        the job: the latest checkpoint's row, the download's response, and the job's JSON."""
        from fastapi.testclient import TestClient  # lazily: only the store tests start an API

        from services.api.main import create_app

        with self.sessions.begin() as session:
            _, token = tokens.create_owner_with_token(session, f"admin-{job_id[-6:]}", admin=True)
        with self.sessions() as session:
            latest = checkpoints.list_checkpoints(session, job_id)[-1]
        api = create_app(self.settings.model_copy(update={"home": home}), run_reaper=False)
        headers = {"Authorization": f"Bearer {token}"}
        with TestClient(api) as client:
            download = client.get(f"/v1/jobs/{job_id}/checkpoints/{latest.step}", headers=headers)
            shown = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        return latest, download, shown

    def checkpoint_problems(self, job_id: str) -> list[str]:
        """What is wrong with the job's checkpoint objects: a listed checkpoint whose object is
        missing or differs from its row (size, sha256), a ``<step>.pt`` no row lists (an
        orphan), a temp file left by an interrupted put. Empty when all is well."""
        store = open_store(self.settings.artifacts_url)
        with self.sessions() as session:
            rows = checkpoints.list_checkpoints(session, job_id)
        problems = []
        for row in rows:
            if is_sharded_key(row.key):
                problems += sharded_problems(store, row)
                continue
            data = b"".join(store.open(row.key)) if store.head(row.key) else None
            if data is None:
                problems.append(f"step {row.step}: listed but {row.key} is missing")
            elif len(data) != row.size_bytes or hashlib.sha256(data).hexdigest() != row.sha256:
                problems.append(f"step {row.step}: {row.key} does not match its row (size, sha256)")
        listed = {row.key for row in rows} | {row.key.rsplit("/", 1)[0] + "/" for row in rows}
        for stored in store.list(f"{job_id}/"):
            folder = stored.key.rsplit("/", 1)[0] + "/"
            if (stored.key.endswith(".pt") or folder != f"{job_id}/") and not ({stored.key, folder} & listed):
                problems.append(f"orphan: {stored.key} is listed by no checkpoint row")
        directory = self.settings.artifacts_path / job_id
        for path in sorted(directory.iterdir()) if directory.is_dir() else []:
            if path.name.endswith(".tmp"):
                problems.append(f"temp file left behind: {path.name}")
        return problems

    def event_kinds(self, job_id: str) -> list[str]:
        with self.sessions() as session:
            return [e.kind for e in events.list_events(session, job_id, limit=1000)]

    def wait(self, job_id: str, statuses: Collection[str] = FINISHED,
             timeout: float = 90.0, check: Any = None) -> Job:
        """Poll until the job is in one of ``statuses`` (and ``check(job)`` holds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job.status in statuses and (check is None or check(job)):
                return job
            if any(p.poll() not in (None, 0, -9) for p in self.workers):
                pytest.fail(f"a worker exited unexpectedly\n{self.worker_logs()}")
            time.sleep(0.05)
        last = self.job(job_id)
        pytest.fail(
            f"job {job_id} still {last.status} after {timeout}s (waiting for {statuses}; "
            f"error {last.error})\n{self.worker_logs()}"
        )

    def cancel(self, job_id: str) -> str:
        with self.sessions.begin() as session:
            job = jobs.load_job(session, job_id)
            assert job is not None
            return jobs.request_cancel(session, job).status

    def holder(self, job_id: str) -> str | None:
        with self.sessions() as session:
            return session.get(Job, job_id).lease_owner  # type: ignore[union-attr]


def sharded_problems(store: ArtifactStore, row: Any) -> list[str]:
    """What is wrong with a sharded checkpoint's objects: a file its manifest lists missing or
    other than listed, a row whose size is not that of every object of its folder."""
    import json

    if store.head(row.key) is None:
        return [f"step {row.step}: listed but its manifest {row.key} is missing"]
    manifest = json.loads(b"".join(store.open(row.key)))
    folder = row.key.rsplit("/", 1)[0]
    problems = []
    for name, facts in manifest["files"].items():
        data = b"".join(store.open(f"{folder}/{name}")) if store.head(f"{folder}/{name}") else None
        if data is None or hashlib.sha256(data).hexdigest() != facts["sha256"]:
            problems.append(f"step {row.step}: shard {folder}/{name} is missing or not as listed")
    stored = sum(o.size for o in store.list(f"{folder}/"))
    if stored != row.size_bytes:
        problems.append(f"step {row.step}: its objects take {stored} bytes, its row says {row.size_bytes}")
    return problems


def weight_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Names of the tensors that differ bitwise between two state dicts, or that one lacks."""
    import torch

    return [n for n in sorted(a.keys() | b.keys())
            if n not in a or n not in b or not torch.equal(a[n], b[n])]


def make_stack(kind: str, tmp: Path, request: pytest.FixtureRequest) -> Stack:
    home = tmp / "home"
    queue = f"it-{uuid.uuid4().hex[:10]}"
    if kind == "sqlite":
        settings = Settings(home=home, **TIMING)  # the embedded default: SQLite + SQLite broker
    else:
        postgres_url = request.getfixturevalue("stack_postgres_url")  # not the API tests'
        redis_url = request.getfixturevalue("redis_url")
        settings = Settings(home=home, database_url=postgres_url, broker_url=redis_url, **TIMING)
    upgrade(settings.database_url)
    logs = tmp / "logs"
    logs.mkdir()
    return Stack(kind, settings, queue, logs)


@pytest.fixture(params=["sqlite", "postgres_redis"], scope="session")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A deployment with one worker already running on its own queue.

    Session-scoped because starting a worker (importing torch) is the slow part here; tests
    that need more workers, or kill one, start them with ``stack.start_worker()``.
    """
    stack = make_stack(request.param, tmp_path_factory.mktemp(request.param), request)
    stack.start_worker()
    try:
        yield stack
    finally:
        stack.stop_workers()
