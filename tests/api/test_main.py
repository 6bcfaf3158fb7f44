"""The app as a whole: torch-free import, lazy module-level `app`, lifespan runs the lease
reaper, OpenAPI and docs served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from fastapi.testclient import TestClient

from services.api.main import create_app
from services.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys, time
start = time.perf_counter()
from services.api.main import app
seconds = time.perf_counter() - start
print(json.dumps({"torch": "torch" in sys.modules, "seconds": seconds, "title": app.title}))
"""


def test_importing_and_building_the_app_never_imports_torch(accum_home: Path) -> None:
    env = {**os.environ, "ACCUM_HOME": str(accum_home)}
    env.pop("ACCUM_DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["torch"] is False
    assert probe["title"] == "accum"  # `app` was built from the ACCUM_* environment on demand


def test_lifespan_starts_and_stops_the_lease_reaper(store_settings: Settings) -> None:
    def reapers() -> int:
        return sum(t.name == "accum-lease-reaper" and t.is_alive() for t in threading.enumerate())

    before = reapers()
    with TestClient(create_app(store_settings)):
        assert reapers() == before + 1
    assert reapers() == before


def test_openapi_and_docs_are_served(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()

    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/metrics", "/readyz"} <= set(schema["paths"])
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert client.get("/docs").status_code == 200
