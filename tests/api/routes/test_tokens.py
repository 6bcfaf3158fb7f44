"""Tokens over HTTP (`/v1/tokens`): make another, list by prefix only, revoke one; an owner
sees and revokes only its own, an admin everyone's; a revoked token is refused at once."""

from __future__ import annotations

from fastapi.testclient import TestClient


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_new_token_is_shown_once_and_works(client: TestClient, alice: dict[str, str]) -> None:
    created = client.post("/v1/tokens", headers=alice)

    assert created.status_code == 201
    assert created.headers["cache-control"] == "no-store"
    body = created.json()
    token = body["token"]
    assert body["owner"] == "alice" and body["prefix"] == token[:12] and body["revoked_at"] is None
    assert client.get("/v1/me", headers=bearer(token)).json()["name"] == "alice"
    listing = client.get("/v1/tokens", headers=alice)
    assert token[:12] in {t["prefix"] for t in listing.json()["items"]}
    assert token[12:] not in listing.text, "a listing must never carry a whole token"


def test_owners_list_their_own_tokens_and_admins_everyones(
    client: TestClient, alice: dict[str, str], bob: dict[str, str], admin: dict[str, str]
) -> None:
    def owners(headers: dict[str, str]) -> set[str]:
        return {t["owner"] for t in client.get("/v1/tokens", headers=headers).json()["items"]}

    assert owners(alice) == {"alice"}
    assert owners(bob) == {"bob"}
    assert owners(admin) == {"alice", "bob", "root"}


def test_revoking_by_prefix_refuses_the_token_at_once_and_keeps_it_listed_as_revoked(
    client: TestClient, alice: dict[str, str]
) -> None:
    token = client.post("/v1/tokens", headers=alice).json()["token"]

    assert client.delete(f"/v1/tokens/{token[:12]}", headers=alice).status_code == 204

    assert client.get("/v1/me", headers=bearer(token)).status_code == 401
    assert client.get("/v1/me", headers=alice).status_code == 200  # her other token
    live = client.get("/v1/tokens", headers=alice).json()["items"]
    assert token[:12] not in {t["prefix"] for t in live}
    trail = client.get("/v1/tokens?include_revoked=true", headers=alice).json()["items"]
    assert [t["revoked_at"] is not None for t in trail if t["prefix"] == token[:12]] == [True]
    again = client.delete(f"/v1/tokens/{token[:12]}", headers=alice)
    assert again.status_code == 404 and "GET /v1/tokens" in again.json()["detail"]


def test_revoking_the_token_in_use_logs_out(client: TestClient, alice: dict[str, str]) -> None:
    in_use = alice["Authorization"].removeprefix("Bearer ")

    assert client.delete(f"/v1/tokens/{in_use[:12]}", headers=alice).status_code == 204

    assert client.get("/v1/me", headers=alice).status_code == 401


def test_another_owners_token_does_not_exist_for_you_but_an_admin_can_revoke_it(
    client: TestClient, alice: dict[str, str], bob: dict[str, str], admin: dict[str, str]
) -> None:
    token = client.post("/v1/tokens", headers=alice).json()["token"]
    prefix = token[:12]

    by_bob = client.delete(f"/v1/tokens/{prefix}", headers=bob)
    unknown = client.delete("/v1/tokens/accum_zzzzzz", headers=bob)

    assert by_bob.status_code == unknown.status_code == 404
    assert by_bob.json()["detail"].replace(prefix, "?") == unknown.json()["detail"].replace(
        "accum_zzzzzz", "?"
    ), "the answer must not reveal that the prefix exists"
    assert client.get("/v1/me", headers=bearer(token)).status_code == 200
    assert client.delete(f"/v1/tokens/{prefix}", headers=admin).status_code == 204
    assert client.get("/v1/me", headers=bearer(token)).status_code == 401


def test_a_whole_token_or_a_short_prefix_in_the_path_is_refused(
    client: TestClient, alice: dict[str, str]
) -> None:
    token = client.post("/v1/tokens", headers=alice).json()["token"]
    for value in (token, "accum_"):
        response = client.delete(f"/v1/tokens/{value}", headers=alice)

        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["loc"] == "path.prefix"
    assert client.get("/v1/me", headers=bearer(token)).status_code == 200
