"""Small helpers shared by the API tests."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import leases
from services.jobdb.models import Job

PROBLEM_JSON = "application/problem+json"


def jobs_stored(session_factory: sessionmaker[Session]) -> int:
    """How many job rows the store holds (a refused request must not add any)."""
    with session_factory() as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def field_error(response: Any, loc: str) -> dict[str, Any]:
    """The problem+json field error at dotted path `loc` (fails listing what was there)."""
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    errors = response.json()["errors"]
    for error in errors:
        if error["loc"] == loc:
            return dict(error)
    raise AssertionError(f"no error at {loc!r}; errors: {errors}")


def claim(
    session_factory: sessionmaker[Session],
    job_id: str,
    worker_id: str = "w1",
    host: str | None = "h",
    gpu: str | None = None,
) -> Job | None:
    """Play a worker taking the job (one committed transaction); the claimed job or None."""
    with session_factory.begin() as session:
        return leases.claim_job(
            session, job_id, worker_id=worker_id, host=host, gpu=gpu, lease_timeout_s=60
        )
