"""A database that cannot be reached gets 503 problem+json with Retry-After, fast; a database
error that is not an outage (a constraint, a bug) stays a 500 with an error id.

(A real PostgreSQL restart under a real API is tests/reliability/test_postgres_restart.py.)
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient
from ports import free_port
from sqlalchemy.exc import IntegrityError

from services.api.main import create_app
from services.settings import Settings

from .helpers import MINIMAL_SPEC

HEADERS = {"Authorization": "Bearer accum_" + "x" * 43}


def test_requests_while_the_database_is_down_get_503_with_retry_after(tmp_path: Path) -> None:
    down = Settings(home=tmp_path, database_url=f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/accum")  # nothing listens
    with TestClient(create_app(down, run_reaper=False), raise_server_exceptions=False) as client:
        for method, path, body in [("GET", "/v1/jobs", None), ("POST", "/v1/jobs", MINIMAL_SPEC),
                                   ("GET", "/v1/jobs/0123456789abcdefghjkmnpqrs", None),
                                   # invalid body: the token is looked up before the 422
                                   ("POST", "/v1/jobs", {"model": "mlp"})]:
            started = time.monotonic()
            response = client.request(method, path, json=body, headers=HEADERS)
            elapsed = time.monotonic() - started
            assert response.status_code == 503, (method, path, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            assert int(response.headers["retry-after"]) > 0
            problem = response.json()
            assert problem["status"] == 503 and "retry" in problem["detail"]
            assert elapsed < 3, f"{method} {path} took {elapsed:.1f} s with the database down"


def test_a_database_error_that_is_not_an_outage_stays_a_500(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path), run_reaper=False)

    def violate() -> None:
        raise IntegrityError("INSERT INTO jobs ...", {}, Exception("duplicate key"))

    app.add_api_route("/test-only/violation", violate)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/test-only/violation")
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert "error_id" in response.json()
