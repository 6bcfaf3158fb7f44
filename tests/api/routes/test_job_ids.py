"""Job ids by short id (the id's last 6 characters, random, which lists show) or unique prefix
(12 characters were shown before): every route that takes an id and `init_from.job` resolve one
to the full id; a prefix of several ids is a 422 naming them; another owner's jobs are neither
found nor named."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

SHOWN = 12  # what `accum jobs` and the dashboard showed before short ids


def two_jobs(client: TestClient, headers: dict[str, str], spec: dict[str, Any]) -> tuple[str, str, int]:
    """Two of the owner's job ids and the length of their common prefix."""
    first, second = (client.post("/v1/jobs", json=spec, headers=headers).json()["id"] for _ in range(2))
    common = next(i for i in range(26) if first[i] != second[i])
    return first, second, common


def test_a_unique_prefix_reaches_the_job_on_every_route(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    first, second, common = two_jobs(client, alice, spec)
    prefix = second[: max(common + 1, 4)]
    assert client.get(f"/v1/jobs/{prefix}", headers=alice).json()["id"] == second
    assert client.get(f"/v1/jobs/{first[:SHOWN].upper()}", headers=alice).json()["id"] == first
    assert client.get(f"/v1/jobs/{prefix}/metrics", headers=alice).json()["items"] == []
    assert client.get(f"/v1/jobs/{prefix}/checkpoints", headers=alice).json()["items"] == []
    kinds = [e["kind"] for e in client.get(f"/v1/jobs/{prefix}/events", headers=alice).json()["items"]]
    assert kinds[:1] == ["created"]
    cancelled = client.post(f"/v1/jobs/{prefix}/cancel", headers=alice)
    assert cancelled.status_code == 202 and cancelled.json()["id"] == second
    assert client.delete(f"/v1/jobs/{prefix}", headers=alice).status_code == 204
    assert client.get(f"/v1/jobs/{second}", headers=alice).status_code == 404
    assert client.get(f"/v1/jobs/{first}", headers=alice).status_code == 200


def test_an_ambiguous_prefix_is_a_422_with_the_candidates(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    first, second, common = two_jobs(client, alice, spec)
    assert common >= 4, "ids of jobs submitted together share their time prefix"
    response = client.get(f"/v1/jobs/{first[:common]}", headers=alice)
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["loc"] == "path.job_id"
    assert {first, second} <= set(error["allowed"])
    assert "ambiguous" in error["msg"] and "give more characters" in error["msg"]


def test_another_owners_prefix_is_not_found_and_not_named(
    client: TestClient, alice: dict[str, str], bob: dict[str, str], spec: dict[str, Any]
) -> None:
    first, second, common = two_jobs(client, alice, spec)
    for prefix in (first[:SHOWN], first[:common]):
        response = client.get(f"/v1/jobs/{prefix}", headers=bob)
        assert response.status_code == 404, response.text
        assert first not in response.text and second not in response.text
        assert "no job id starts with" in response.json()["detail"]
    short = client.get("/v1/jobs/01", headers=alice)
    assert short.status_code == 404 and "at least 4 characters" in short.json()["detail"]


def test_init_from_takes_a_prefix_and_stores_the_full_id(
    client: TestClient, alice: dict[str, str], bob: dict[str, str], spec: dict[str, Any]
) -> None:
    first, second, common = two_jobs(client, alice, spec)
    response = client.post("/v1/jobs", json={**spec, "init_from": {"job": first[:SHOWN]}}, headers=alice)
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["init_from"]["job"] == first

    ambiguous = client.post("/v1/jobs", json={**spec, "init_from": {"job": first[:common]}}, headers=alice)
    assert ambiguous.status_code == 422
    [error] = ambiguous.json()["errors"]
    assert error["loc"] == "body.init_from.job" and {first, second} <= set(error["allowed"])

    theirs = client.post("/v1/jobs", json={**spec, "init_from": {"job": first[:SHOWN]}}, headers=bob)
    assert theirs.status_code == 422 and first not in theirs.text


def test_the_short_id_is_the_random_tail_and_reaches_the_job(
    client: TestClient, alice: dict[str, str], bob: dict[str, str], spec: dict[str, Any]
) -> None:
    first, second, _ = two_jobs(client, alice, spec)
    assert first[-6:] != second[-6:], "jobs of the same millisecond differ in their tail too"
    assert client.get(f"/v1/jobs/{second[-6:]}", headers=alice).json()["id"] == second
    assert client.get(f"/v1/jobs/{first[-6:].upper()}/events", headers=alice).status_code == 200
    assert client.get(f"/v1/jobs/{second[-6:]}", headers=bob).status_code == 404
