"""The app as a whole: torch-free import with no worker code, lazy module-level `app`, lifespan runs the lease
reaper, OpenAPI and docs served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.api.main import ROUTE_THREADS, create_app
from services.jobdb import jobs, leases, tokens
from services.jobdb.models import Job
from services.jobdb.types import utcnow
from services.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys, time
start = time.perf_counter()
from services.api.main import app
seconds = time.perf_counter() - start
catalog = "services.catalog" in sys.modules  # GET /v1/catalog and spec validation read it
worker = sorted(m for m in sys.modules if m == "services.worker" or m.startswith("services.worker."))
print(json.dumps({"torch": "torch" in sys.modules, "catalog": catalog, "seconds": seconds,
                  "title": app.title, "worker": worker}))
"""


def test_importing_and_building_the_app_imports_neither_torch_nor_the_worker(accum_home: Path) -> None:
    env = {**os.environ, "ACCUM_HOME": str(accum_home)}
    env.pop("ACCUM_DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["catalog"] is True and probe["torch"] is False
    assert probe["worker"] == []  # enqueue and reaper come from services.dispatch
    assert probe["title"] == "accum"  # `app` was built from the ACCUM_* environment on demand


def test_lifespan_sizes_the_thread_pool_and_runs_the_lease_reaper(api_settings: Settings) -> None:
    def reapers() -> int:
        return sum(t.name == "accum-lease-reaper" and t.is_alive() for t in threading.enumerate())

    def route_threads() -> int:
        return int(anyio.to_thread.current_default_thread_limiter().total_tokens)

    before = reapers()
    with TestClient(create_app(api_settings)) as client:
        assert reapers() == before + 1
        assert client.portal is not None
        assert client.portal.call(route_threads) == ROUTE_THREADS
    assert reapers() == before


def test_the_api_process_requeues_jobs_whose_worker_died(
    api_settings: Settings, session_factory: sessionmaker[Session], broker_messages: Any
) -> None:
    with session_factory.begin() as session:
        owner, _ = tokens.create_owner_with_token(session, "alice")
        job, _ = jobs.create_job(session, owner=owner, spec={"model": "mlp"})
    with session_factory.begin() as session:
        # Claimed two minutes ago with a 60 s lease that nobody renewed: the worker is gone.
        long_ago = utcnow() - timedelta(seconds=120)
        leases.claim_job(session, job.id, "dead-worker", "h", None, lease_timeout_s=60, now=long_ago)
    settings = api_settings.model_copy(update={"reaper_interval_s": 0.1})

    with TestClient(create_app(settings)):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and job.id not in broker_messages():
            time.sleep(0.05)

    with session_factory() as session:
        reaped = session.get(Job, job.id)
        assert reaped is not None and reaped.status == "queued" and reaped.restarts == 1
    assert broker_messages() == [job.id]


def test_openapi_and_docs_are_served(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()

    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/metrics", "/readyz"} <= set(schema["paths"])
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert client.get("/docs").status_code == 200
