"""Tokens over HTTP (`/v1/tokens`): list by prefix only, revoke one; an owner sees and revokes
only its own, an admin everyone's; only an admin makes tokens; a revoked token is refused at
once."""

from __future__ import annotations

from fastapi.testclient import TestClient


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def make_token(client: TestClient, admin: dict[str, str], owner: str) -> str:
    created = client.post("/v1/tokens", headers=admin, json={"owner": owner})
    assert created.status_code == 201, created.text
    return str(created.json()["token"])


def test_an_admin_makes_a_token_shown_once_that_works(
    client: TestClient, alice: dict[str, str], admin: dict[str, str]
) -> None:
    created = client.post("/v1/tokens", headers=admin, json={"owner": "alice"})

    assert created.status_code == 201
    assert created.headers["cache-control"] == "no-store"
    body = created.json()
    token = body["token"]
    assert body["owner"] == "alice" and body["prefix"] == token[:12] and body["revoked_at"] is None
    assert client.get("/v1/me", headers=bearer(token)).json()["name"] == "alice"
    listing = client.get("/v1/tokens", headers=alice)
    assert token[:12] in {t["prefix"] for t in listing.json()["items"]}
    assert token[12:] not in listing.text, "a listing must never carry a whole token"
    own = client.post("/v1/tokens", headers=admin)  # no body: the admin's own
    assert own.status_code == 201 and own.json()["owner"] == "root"
    new_owner = client.post("/v1/tokens", headers=admin, json={"owner": "carol"})
    assert client.get("/v1/me", headers=bearer(new_owner.json()["token"])).json() == {
        "name": "carol", "is_admin": False, "data_roots": None,
    }


def test_an_owner_cannot_mint_tokens_so_a_leaked_one_cannot_outlive_its_revocation(
    client: TestClient, alice: dict[str, str]
) -> None:
    before = client.get("/v1/tokens", headers=alice).json()["items"]
    refused = client.post("/v1/tokens", headers=alice)
    blank = client.post("/v1/tokens", headers=alice, json={"owner": "  "})

    assert refused.status_code == 403 and "accum token create" in refused.json()["detail"]
    assert blank.status_code == 422 and blank.json()["errors"][0]["loc"] == "body.owner"
    assert client.get("/v1/tokens", headers=alice).json()["items"] == before


def test_owners_list_their_own_tokens_and_admins_everyones(
    client: TestClient, alice: dict[str, str], bob: dict[str, str], admin: dict[str, str]
) -> None:
    def owners(headers: dict[str, str]) -> set[str]:
        return {t["owner"] for t in client.get("/v1/tokens", headers=headers).json()["items"]}

    assert owners(alice) == {"alice"}
    assert owners(bob) == {"bob"}
    assert owners(admin) == {"alice", "bob", "root"}


def test_revoking_by_prefix_refuses_the_token_at_once_and_keeps_it_listed_as_revoked(
    client: TestClient, alice: dict[str, str], admin: dict[str, str]
) -> None:
    token = make_token(client, admin, "alice")

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
    token = make_token(client, admin, "alice")
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


def test_a_whole_token_or_a_malformed_prefix_in_the_path_is_refused(
    client: TestClient, alice: dict[str, str], admin: dict[str, str]
) -> None:
    token = make_token(client, admin, "alice")
    for value in (token, "accum_", token[:11] + "%20"):
        response = client.delete(f"/v1/tokens/{value}", headers=alice)

        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["loc"] == "path.prefix"
    assert client.get("/v1/me", headers=bearer(token)).status_code == 200


def test_a_listing_says_when_each_token_was_last_used(
    client: TestClient, alice: dict[str, str], admin: dict[str, str]
) -> None:
    fresh = make_token(client, admin, "alice")

    def last_used(prefix: str) -> str | None:
        items = client.get("/v1/tokens", headers=alice).json()["items"]
        return next(t["last_used_at"] for t in items if t["prefix"] == prefix)

    assert last_used(fresh[:12]) is None  # made, never presented
    assert client.get("/v1/me", headers=bearer(fresh)).status_code == 200
    used = last_used(fresh[:12])
    assert used is not None and used.startswith("20")
    # The token listing itself was a use of alice's token, and it was committed.
    assert last_used(alice["Authorization"].split()[1][:12]) is not None


def test_token_creation_refuses_unknown_fields_and_odd_owner_names(
    client: TestClient, admin: dict[str, str]
) -> None:
    before = client.get("/v1/tokens", headers=admin).json()["items"]
    escalation = client.post("/v1/tokens", headers=admin, json={"owner": "mallory", "admin": True})
    assert escalation.status_code == 422
    assert escalation.json()["errors"][0]["loc"] == "body.admin"
    for name in ("a\nb", "with space", "x" * 65, "", "tab\there", "ünï"):
        refused = client.post("/v1/tokens", headers=admin, json={"owner": name})
        assert refused.status_code == 422, name
        error = refused.json()["errors"][0]
        assert error["loc"] == "body.owner" and "[A-Za-z0-9._-]{1,64}" in error["msg"], name
    assert client.get("/v1/tokens", headers=admin).json()["items"] == before
    assert make_token(client, admin, "ok.name_1-x" + "y" * 53)  # 64 characters
