"""A job's captured output over HTTP: the JSON list paged by id and filtered by attempt, the
live stream's replay of a finished job, bad parameters as field-path 422s, and another owner's
job as a 404 (the whole path through a real worker is tests/cli/test_logs.py)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from accum import parse_sse
from services.jobdb.job_logs import add_lines


def store_lines(session_factory: sessionmaker[Session], job_id: str) -> None:
    with session_factory.begin() as session:
        add_lines(session, job_id, 1, [("stdout", "epoch 0 starts"), ("stderr", "UserWarning: tiny")])
        add_lines(session, job_id, 2, [("stdout", "resumed at step 4")])


def test_lines_are_listed_oldest_first_per_attempt_and_paged_by_id(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    store_lines(session_factory, job_id)

    items = client.get(f"/v1/jobs/{job_id}/logs", headers=alice).json()["items"]
    assert [(i["attempt"], i["stream"], i["line"]) for i in items] == [
        (1, "stdout", "epoch 0 starts"), (1, "stderr", "UserWarning: tiny"), (2, "stdout", "resumed at step 4")]
    second = client.get(f"/v1/jobs/{job_id[:12]}/logs", params={"attempt": 2}, headers=alice).json()["items"]
    assert [i["line"] for i in second] == ["resumed at step 4"]
    page = client.get(f"/v1/jobs/{job_id}/logs", params={"after": items[0]["id"], "limit": 1},
                      headers=alice).json()["items"]
    assert [i["line"] for i in page] == ["UserWarning: tiny"]


def test_the_stream_of_a_finished_job_replays_its_lines_then_ends(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    store_lines(session_factory, job_id)
    client.post(f"/v1/jobs/{job_id}/cancel", headers=alice)

    response = client.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 1},
                          headers={**alice, "Accept": "text/event-stream"})
    messages = list(parse_sse(iter(response.text.splitlines())))

    assert [e for e, _ in messages] == ["log", "log", "end"]
    assert [d["line"] for e, d in messages if e == "log"] == ["epoch 0 starts", "UserWarning: tiny"]
    assert messages[-1][1] == {"status": "cancelled"}
    first_id = messages[0][1]["id"]
    again = client.get(f"/v1/jobs/{job_id}/logs",
                       headers={**alice, "Accept": "text/event-stream", "Last-Event-ID": str(first_id)})
    assert [d["line"] for e, d in parse_sse(iter(again.text.splitlines())) if e == "log"] == [
        "UserWarning: tiny", "resumed at step 4"]


def test_bad_parameters_get_422_with_the_field_and_its_bound(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any]
) -> None:
    for params, field, bound in (({"attempt": 0}, "attempt", "1"), ({"limit": 10_001}, "limit", "at most 10,000; got 10001"),
                                 ({"after": -1}, "after", "0")):
        response = client.get(f"/v1/jobs/{submitted['id']}/logs", params=params, headers=alice)
        assert response.status_code == 422, response.text
        assert field in response.text and bound in response.text


def test_another_owners_job_is_not_found(
    client: TestClient, bob: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    store_lines(session_factory, submitted["id"])
    response = client.get(f"/v1/jobs/{submitted['id']}/logs", headers=bob)
    assert response.status_code == 404
    assert "epoch 0" not in response.text
