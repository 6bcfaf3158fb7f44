"""What the browser tests talk to: the server's URL, an admin token, and the worker stack;
and `Run`, a job whose life a test writes into the store as a worker would (metrics with
NaN, events, the outcome), for pages whose content must be exact."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from worker_stack import Stack

from services.jobdb import checkpoints, events, job_logs, leases, metrics
from services.jobdb.models import Job
from services.jobdb.types import utcnow

# A fake worker's lease outlives any test: the real worker never takes these jobs over.
FAKE_LEASE_S = 3600


@dataclass(frozen=True)
class Deployment:
    url: str
    token: str
    stack: Stack

    def api(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )

    def submit(self, **spec: Any) -> str:
        """Submit over HTTP, on the queue this deployment's worker consumes."""
        with self.api() as client:
            response = client.post("/v1/jobs", json={**spec, "queue": self.stack.queue})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def run(self, name: str, **spec: Any) -> Run:
        """A job held by a fake worker: running, and whatever the test writes next."""
        job_id = self.stack.create(enqueue=False, **spec)
        worker = f"fake-{uuid.uuid4().hex[:6]}"
        with self.stack.sessions.begin() as session:
            session.get(Job, job_id).name = name  # type: ignore[union-attr]
            assert leases.claim_job(session, job_id, worker, "node-7", "cpu", FAKE_LEASE_S)
        return Run(self.stack, job_id, worker)


@dataclass(frozen=True)
class Run:
    stack: Stack
    id: str
    worker: str

    def metrics(self, name: str, values: dict[int, float], epoch_of: Any = lambda step: 0) -> None:
        rows = [{"name": name, "step": s, "epoch": epoch_of(s), "value": v, "ts": utcnow()}
                for s, v in values.items()]
        with self.stack.sessions.begin() as session:
            metrics.write_metrics(session, self.id, 1, rows)

    def progress(self, step: int, latest: dict[str, float]) -> None:
        with self.stack.sessions.begin() as session:
            leases.update_progress(session, self.id, {"optimizer_step": step, "epoch": 0}, latest)

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        with self.stack.sessions.begin() as session:
            events.add_event(session, self.id, kind, message, data or {}, attempt=1)

    def restart_from(self, step: int) -> Run:
        """The worker is lost; another takes the job over from its checkpoint at `step`."""
        with self.stack.sessions.begin() as session:
            checkpoints.add_checkpoint(session, self.id, step, f"/nowhere/{step}.pt", 1, "0" * 64)
        later = utcnow() + timedelta(seconds=FAKE_LEASE_S + 1)
        worker = f"fake-{uuid.uuid4().hex[:6]}"
        with self.stack.sessions.begin() as session:
            assert leases.claim_job(session, self.id, worker, "node-8", "cpu", FAKE_LEASE_S, now=later)
        return Run(self.stack, self.id, worker)

    def finish(self, status: str, error: dict[str, Any] | None = None) -> None:
        with self.stack.sessions.begin() as session:
            assert leases.finish_job(session, self.id, self.worker, status, error)

    def prints(self, attempt: int, lines: list[tuple[str, str]]) -> None:
        """Lines the job's training printed (``(stream, line)``), as the worker's capture stores them."""
        with self.stack.sessions.begin() as session:
            job_logs.add_lines(session, self.id, attempt, lines)
