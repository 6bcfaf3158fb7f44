"""`POST /v1/jobs/{id}/resume` with an optional body: from the latest checkpoint (no body), from
an older one (`from_step`: later checkpoint rows go, so a restart cannot jump back to them), or
`from_scratch`; a step without a checkpoint is a 422 naming the retained steps."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import checkpoints, jobs


def failed_with_checkpoints(session_factory: sessionmaker[Session], job_id: str,
                            steps: tuple[int, ...] = (10, 20, 30)) -> None:
    with session_factory.begin() as session:
        for step in steps:
            checkpoints.add_checkpoint(session, job_id, step, f"{job_id}/{step}.pt", 1, "0" * 64)
        job = jobs.load_job(session, job_id)
        assert job is not None
        job.status = "failed"


def resume_step_and_rows(session_factory: sessionmaker[Session], job_id: str) -> tuple[Any, list[int]]:
    with session_factory() as session:
        job = jobs.load_job(session, job_id)
        assert job is not None
        return job.resume_step, [c.step for c in checkpoints.list_checkpoints(session, job_id)]


def test_resume_without_a_body_starts_from_the_latest(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    failed_with_checkpoints(session_factory, submitted["id"])
    response = client.post(f"/v1/jobs/{submitted['id']}/resume", headers=alice)
    assert response.status_code == 202 and response.json()["status"] == "queued"
    assert resume_step_and_rows(session_factory, submitted["id"]) == (30, [10, 20, 30])


def test_resume_from_an_older_step_drops_the_later_checkpoints(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    failed_with_checkpoints(session_factory, submitted["id"])
    response = client.post(f"/v1/jobs/{submitted['id']}/resume", json={"from_step": 10}, headers=alice)
    assert response.status_code == 202
    assert resume_step_and_rows(session_factory, submitted["id"]) == (10, [10])


def test_resume_from_scratch_drops_every_checkpoint(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    failed_with_checkpoints(session_factory, submitted["id"])
    response = client.post(f"/v1/jobs/{submitted['id']}/resume", json={"from_scratch": True},
                           headers=alice)
    assert response.status_code == 202
    assert resume_step_and_rows(session_factory, submitted["id"]) == (None, [])


def test_a_step_without_a_checkpoint_is_422_with_the_retained_steps(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    failed_with_checkpoints(session_factory, submitted["id"])
    response = client.post(f"/v1/jobs/{submitted['id']}/resume", json={"from_step": 15}, headers=alice)
    assert response.status_code == 422
    (error,) = response.json()["errors"]
    assert error["loc"] == "body.from_step" and error["allowed"] == [10, 20, 30]
    both = client.post(f"/v1/jobs/{submitted['id']}/resume",
                       json={"from_step": 10, "from_scratch": True}, headers=alice)
    assert both.status_code == 422 and "not both" in both.json()["detail"]
    assert resume_step_and_rows(session_factory, submitted["id"])[1] == [10, 20, 30]  # untouched


def test_resume_with_a_timeout_sets_the_new_limit_and_counts_from_zero(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session], api_settings: Any,
) -> None:
    job_id = submitted["id"]
    failed_with_checkpoints(session_factory, job_id)
    with session_factory.begin() as session:
        job = jobs.load_job(session, job_id)
        assert job is not None
        job.run_seconds = 3600.0  # it ran out its timeout
    too_long = client.post(f"/v1/jobs/{job_id}/resume",
                           json={"timeout": api_settings.max_job_seconds + 1}, headers=alice)
    assert too_long.status_code == 422
    (error,) = too_long.json()["errors"]
    assert error["loc"] == "body.timeout" and "ACCUM_MAX_JOB_SECONDS" in error["msg"]
    garbled = client.post(f"/v1/jobs/{job_id}/resume", json={"timeout": "2 fortnights"},
                          headers=alice)
    assert garbled.status_code == 422 and garbled.json()["errors"][0]["loc"] == "body.timeout"

    response = client.post(f"/v1/jobs/{job_id}/resume", json={"timeout": "2h"}, headers=alice)
    assert response.status_code == 202, response.text
    assert response.json()["spec"]["timeout"] == 7200
    with session_factory() as session:
        resumed = jobs.load_job(session, job_id)
        assert resumed is not None
        assert (resumed.spec["timeout"], resumed.run_seconds) == (7200, 0.0)
