"""Queue order over the API: `priority` in the spec (owners may lower theirs, only admins
raise one to high), a queued job's `queue_position` (priority first, then age), the message
sent at the job's priority."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb.models import Job

from ..helpers import claim, field_error, jobs_stored


def test_only_admins_raise_a_priority(
    client: TestClient, alice: dict[str, str], admin: dict[str, str], spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    error = field_error(client.post("/v1/jobs", json={**spec, "priority": "high"}, headers=alice),
                        "body.priority")
    assert error["allowed"] == ["low", "normal"] and "admins" in error["msg"]
    bad = field_error(client.post("/v1/jobs", json={**spec, "priority": "urgent"}, headers=alice),
                      "body.priority")
    assert bad["allowed"] == ["low", "normal", "high"]
    assert jobs_stored(session_factory) == 0
    low = client.post("/v1/jobs", json={**spec, "priority": "low"}, headers=alice).json()
    high = client.post("/v1/jobs", json={**spec, "priority": "high"}, headers=admin).json()
    assert (low["spec"]["priority"], high["spec"]["priority"]) == ("low", "high")
    with session_factory() as session:
        assert session.get(Job, low["id"]).priority == 0  # type: ignore[union-attr]
        assert session.get(Job, high["id"]).priority == 2  # type: ignore[union-attr]


def test_queue_position_counts_higher_priorities_then_older_jobs(
    client: TestClient, alice: dict[str, str], admin: dict[str, str], spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    def submit(priority: str, headers: dict[str, str], **more: Any) -> str:
        body = {**spec, "priority": priority, "seed": len(ids), **more}
        response = client.post("/v1/jobs", json=body, headers=headers)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    ids: list[str] = []
    for priority, headers in (("normal", alice), ("low", alice), ("high", admin), ("normal", alice)):
        ids.append(submit(priority, headers))
    other_queue = submit("high", admin, queue="a100")  # another line altogether

    def position(job_id: str) -> int | None:
        return client.get(f"/v1/jobs/{job_id}", headers=admin).json()["queue_position"]

    assert [position(i) for i in ids] == [2, 4, 1, 3] and position(other_queue) == 1
    assert claim(session_factory, ids[2])  # the high one starts: everyone moves up
    assert [position(i) for i in ids] == [1, 3, None, 2]
