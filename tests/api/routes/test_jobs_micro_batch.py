"""``micro_batch_chosen`` in ``GET /v1/jobs/{id}``: null until the first attempt of a
``micro_batch_size: "auto"`` job stores its (m, N) on the job row
(``services.worker.micro_batch.remember``), then that choice. Both store backends."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb.models import Job

AUTO = {"micro_batch_size": "auto", "effective_batch_size": 64}


def test_an_auto_job_shows_null_until_its_first_attempt_chose_then_the_choice(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    body = {**{k: v for k, v in spec.items() if k not in ("micro_batch_size", "accumulation_steps")}, **AUTO}
    created = client.post("/v1/jobs", json=body, headers=alice)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert created.json()["micro_batch_chosen"] is None

    with session_factory.begin() as session:  # as the worker's first attempt stores it
        job = session.get(Job, job_id)
        assert job is not None
        job.micro_batch_chosen = {"micro_batch_size": 16, "accumulation_steps": 4}

    shown = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert shown["micro_batch_chosen"] == {"micro_batch_size": 16, "accumulation_steps": 4}
    listed = client.get("/v1/jobs", headers=alice).json()["items"]
    assert [j["micro_batch_chosen"] for j in listed if j["id"] == job_id] == [
        {"micro_batch_size": 16, "accumulation_steps": 4}]


def test_a_fixed_micro_batch_shows_null(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any]
) -> None:
    assert submitted["spec"]["micro_batch_size"] != "auto"
    assert client.get(f"/v1/jobs/{submitted['id']}", headers=alice).json()["micro_batch_chosen"] is None
