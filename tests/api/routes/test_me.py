"""Who am I (`GET /v1/me`), and whose job is whose (`owner` in job reads): what the dashboard
needs to greet the user and to show admins an owner column."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from services.data_roots import allowed_data_roots
from services.settings import Settings


def test_me_names_the_token_owner_and_whether_it_is_an_admin(
    client: TestClient, alice: dict[str, str], admin: dict[str, str], api_settings: Settings
) -> None:
    assert client.get("/v1/me", headers=alice).json() == {"name": "alice", "is_admin": False, "data_roots": None}
    # The allowed data roots are the servers' paths: told to admins only (the submit form offers them).
    roots = [str(root) for root in allowed_data_roots(api_settings)]
    assert roots
    assert client.get("/v1/me", headers=admin).json() == {"name": "root", "is_admin": True, "data_roots": roots}


def test_me_needs_a_valid_token(client: TestClient) -> None:
    response = client.get("/v1/me", headers={"Authorization": "Bearer nope"})

    assert response.status_code == 401
    assert "accum token create" in response.json()["detail"]


def test_jobs_carry_their_owner_name_for_the_owner_and_for_admins(
    client: TestClient,
    alice: dict[str, str],
    bob: dict[str, str],
    admin: dict[str, str],
    spec: dict[str, Any],
) -> None:
    alices = client.post("/v1/jobs", json=spec, headers=alice).json()["id"]
    bobs = client.post("/v1/jobs", json=spec, headers=bob).json()["id"]

    as_admin = {j["id"]: j["owner"] for j in client.get("/v1/jobs", headers=admin).json()["items"]}
    assert as_admin == {alices: "alice", bobs: "bob"}
    assert [j["owner"] for j in client.get("/v1/jobs", headers=alice).json()["items"]] == ["alice"]
    assert client.get(f"/v1/jobs/{bobs}", headers=admin).json()["owner"] == "bob"
    assert client.get(f"/v1/jobs/{alices}", headers=alice).json()["owner"] == "alice"
