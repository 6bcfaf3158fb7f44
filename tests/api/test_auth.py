"""Bearer auth on every /v1 route (services/api/auth.py): 401 with a challenge, before any 422;
owners isolated (404, not 403), admins see everything; the token lookup stands in for the
pool's pre-ping; the bad-token limit is shared by API processes."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from fastapi import APIRouter, Depends, FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from services.api.auth import MAX_ADDRESS_LENGTH, CurrentOwner, get_current_owner
from services.api.main import create_app
from services.jobdb.models import AuthFailure
from services.settings import Settings

from .helpers import PROBLEM_JSON, jobs_stored

WRONG = {"Authorization": "Bearer accum_not-a-real-token"}

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


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/jobs", {"model": "mlp"}),  # body misses fields
        ("POST", "/v1/jobs", None),  # no body at all
        ("GET", "/v1/jobs?limit=0", None),  # query out of range
        ("GET", "/v1/jobs/{id}/metrics?since_step=-1", None),
    ],
)
def test_a_wrong_token_gets_401_even_when_the_parameters_are_invalid(
    client: TestClient, submitted: dict[str, Any], method: str, path: str, body: Any
) -> None:
    response = client.request(method, path.format(id=submitted["id"]), json=body, headers=WRONG)

    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_a_good_token_with_invalid_parameters_still_gets_422(
    client: TestClient, alice: dict[str, str]
) -> None:
    response = client.post("/v1/jobs", json={"model": "mlp"}, headers=alice)

    assert response.status_code == 422
    assert {e["loc"] for e in response.json()["errors"]} >= {"body.dataset"}


def test_a_wrong_token_stores_nothing_and_counts_as_a_failed_check(
    api_settings: Settings, session_factory: sessionmaker[Session], spec: dict[str, Any]
) -> None:
    settings = api_settings.model_copy(update={"auth_failures_per_window": 2})
    app = create_app(settings, run_reaper=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        first = client.post("/v1/jobs", json=spec, headers=WRONG)  # valid body: route skipped
        second = client.post("/v1/jobs", json={}, headers=WRONG)  # invalid body: 422 path
        third = client.post("/v1/jobs", json=spec, headers=WRONG)

    assert (first.status_code, second.status_code, third.status_code) == (401, 401, 429)
    assert jobs_stored(session_factory) == 0


def owner_name(owner: CurrentOwner) -> str:
    """A dependency that itself takes the owner (module level: annotations resolve here)."""
    return owner.name


@pytest.mark.parametrize("place", ["decorator", "sub_dependency"])
def test_the_owner_may_be_depended_on_anywhere(
    api_settings: Settings, alice: dict[str, str], place: str
) -> None:
    """A plain dependency: `dependencies=[Depends(get_current_owner)]` or a dependency that
    takes the owner looks the token up like a route parameter does."""
    app: FastAPI = create_app(api_settings, run_reaper=False)
    router = APIRouter()

    if place == "decorator":

        @router.get("/v1/guarded", dependencies=[Depends(get_current_owner)])
        def guarded() -> str:
            return "secret"
    else:

        @router.get("/v1/guarded")
        def guarded(name: Annotated[str, Depends(owner_name)]) -> str:
            return name

    app.include_router(router)
    with TestClient(app, raise_server_exceptions=False) as client:
        refused = client.get("/v1/guarded", headers=WRONG)
        allowed = client.get("/v1/guarded", headers=alice)

    assert refused.status_code == 401
    assert allowed.json() == ("secret" if place == "decorator" else "alice")


@pytest.mark.parametrize("database_backend", ["postgresql"])  # SQLite connections are files
def test_connections_the_database_dropped_cost_no_request(
    postgres_url: str, client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    """The API's pool has no pre-ping: when PostgreSQL ends every pooled connection (a
    restart, an idle timeout, an operator), the token lookup meets a dead connection, the
    pool is renewed and the lookup tried again: the client sees only 2xx."""
    engine = client.app.state.engine  # type: ignore[attr-defined]
    held = [engine.connect() for _ in range(4)]  # four connections at once: all pooled after
    for connection in held:
        connection.exec_driver_sql("SELECT 1")
        connection.close()
    assert engine.pool.checkedin() >= 4
    database = client.app.state.engine.url.database  # type: ignore[attr-defined]
    admin = create_engine(postgres_url, poolclass=NullPool)
    with admin.begin() as conn:
        ended = conn.execute(
            text(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :db AND pid <> pg_backend_pid()) AS t"
            ),
            {"db": database},
        ).scalar_one()
    admin.dispose()
    assert ended >= 1, "no API connection was open: the test tested nothing"

    answers = [client.get("/v1/jobs", headers=alice).status_code for _ in range(8)]
    answers.append(client.post("/v1/jobs", json=spec, headers=alice).status_code)

    assert answers == [200] * 8 + [201]


def test_api_processes_share_the_bad_token_limit(
    api_settings: Settings, session_factory: sessionmaker[Session]
) -> None:
    """Two API processes on one database (two apps here): an address gets `limit` + 1 bad
    token checks in all, then 429 from both, where each alone would have allowed `limit`."""
    limit = 4
    settings = api_settings.model_copy(update={"auth_failures_per_window": limit})
    with (
        TestClient(create_app(settings, run_reaper=False), raise_server_exceptions=False) as one,
        TestClient(create_app(settings, run_reaper=False), raise_server_exceptions=False) as two,
    ):
        answers = [
            (one if i % 2 == 0 else two).get("/v1/jobs", headers=WRONG).status_code
            for i in range(2 * limit)
        ]

    assert answers == [401] * (limit + 1) + [429] * (limit - 1)


def test_a_forwarded_address_is_counted_cut_to_its_cap(
    api_settings: Settings, session_factory: sessionmaker[Session]
) -> None:
    """With every hop trusted the counted address is the first X-Forwarded-For entry, which
    the client writes: it is cut to MAX_ADDRESS_LENGTH, so a long one fits the shared log's
    column (uncut, PostgreSQL refuses it and other API processes never see the failure)."""
    settings = api_settings.model_copy(
        update={"auth_failures_per_window": 1, "forwarded_allow_ips": "*"}
    )
    forged = {**WRONG, "X-Forwarded-For": "x" * 500 + ", 192.0.2.5"}
    app = create_app(settings, run_reaper=False)
    with TestClient(app, raise_server_exceptions=False, client=("192.0.2.6", 40000)) as proxy:
        answers = [proxy.get("/v1/jobs", headers=forged).status_code for _ in range(3)]

    assert answers == [401, 429, 429]
    with session_factory() as session:
        keys = set(session.scalars(select(AuthFailure.address)))
    assert f"address:{'x' * MAX_ADDRESS_LENGTH}" in keys
    assert not any(key.startswith("address:") and len(key) > 8 + MAX_ADDRESS_LENGTH for key in keys)
