"""Bearer auth on every /v1 route: 401 with a challenge, owners isolated (404, not 403),
admins see everything."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from .helpers import PROBLEM_JSON

V1_ROUTES = [
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{id}"),
    ("POST", "/v1/jobs/{id}/cancel"),
    ("POST", "/v1/jobs/{id}/resume"),
    ("GET", "/v1/jobs/{id}/metrics"),
    ("GET", "/v1/jobs/{id}/events"),
    ("GET", "/v1/jobs/{id}/checkpoints"),
    ("GET", "/v1/jobs/{id}/checkpoints/1"),
    ("GET", "/v1/catalog/models"),
    ("GET", "/v1/catalog/datasets"),
    ("GET", "/v1/me"),
    ("GET", "/v1/tokens"),
    ("POST", "/v1/tokens"),
    ("DELETE", "/v1/tokens/accum_abcdef"),
]


def test_every_v1_route_refuses_missing_or_wrong_tokens(
    client: TestClient, submitted: dict[str, Any]
) -> None:
    for authorization in [None, "", "Bearer", "Bearer ", "Basic YWxpY2U6eA==", "Bearer accum_not-a-real-token"]:
        headers = {} if authorization is None else {"Authorization": authorization}
        for method, path in V1_ROUTES:
            response = client.request(method, path.format(id=submitted["id"]), headers=headers)

            assert response.status_code == 401, (authorization, method, path, response.text)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert response.headers["content-type"].startswith(PROBLEM_JSON)
            detail = response.json()["detail"]
            assert "accum token create" in detail or "Bearer" in detail


def test_another_owners_job_does_not_exist_for_you(
    client: TestClient, bob: dict[str, str], submitted: dict[str, Any]
) -> None:
    job_id = submitted["id"]
    for method, path in V1_ROUTES[2:9]:
        response = client.request(method, path.format(id=job_id), headers=bob)

        assert response.status_code == 404, (method, path, response.text)
    listing = client.get("/v1/jobs", headers=bob).json()
    assert listing["items"] == []


def test_admin_sees_and_acts_on_every_owners_jobs(
    client: TestClient,
    alice: dict[str, str],
    bob: dict[str, str],
    admin: dict[str, str],
    spec: dict[str, Any],
) -> None:
    a = client.post("/v1/jobs", json=spec, headers=alice).json()["id"]
    b = client.post("/v1/jobs", json=spec, headers=bob).json()["id"]

    listing = client.get("/v1/jobs", headers=admin).json()
    assert {j["id"] for j in listing["items"]} == {a, b}
    assert client.get(f"/v1/jobs/{a}", headers=admin).status_code == 200
    assert client.post(f"/v1/jobs/{b}/cancel", headers=admin).status_code == 202
    # ...while the owners still see only their own.
    assert [j["id"] for j in client.get("/v1/jobs", headers=alice).json()["items"]] == [a]


def test_health_and_prometheus_need_no_token(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 200
