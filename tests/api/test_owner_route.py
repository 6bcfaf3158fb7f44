"""The token lookup rides the route's own thread (services/api/owner_route.py) and stands in
for the pool's pre-ping: what that must not change for a client, on both backends."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from fastapi import APIRouter, Depends, FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from services.api.deps import CurrentOwner, get_current_owner
from services.api.main import create_app
from services.api.owner_route import OwnerLookupRoute, check_owner_routes
from services.settings import Settings

from .helpers import jobs_stored

WRONG = {"Authorization": "Bearer accum_not-a-real-token"}


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


def test_a_route_that_takes_the_owner_must_look_it_up_in_its_own_thread(
    api_settings: Settings,
) -> None:
    app: FastAPI = create_app(api_settings, run_reaper=False)
    plain = APIRouter()  # no route_class=OwnerLookupRoute: it would get a PendingOwner

    @plain.get("/v1/forgotten")
    def forgotten(owner: CurrentOwner) -> str:
        return owner.name

    app.include_router(plain)

    with pytest.raises(RuntimeError, match=r"\['GET'\] /v1/forgotten.*route_class=OwnerLookupRoute"):
        check_owner_routes(app)


def owner_name(owner: CurrentOwner) -> str:
    """A dependency that itself takes the owner (module level: annotations resolve here)."""
    return owner.name


@pytest.mark.parametrize("place", ["decorator", "sub_dependency"])
def test_the_owner_may_only_be_an_endpoint_parameter(api_settings: Settings, place: str) -> None:
    """`dependencies=[Depends(get_current_owner)]` would never look the token up (any
    well-formed token would pass), a sub-dependency would get the PendingOwner: refused."""
    app: FastAPI = create_app(api_settings, run_reaper=False)
    router = APIRouter(route_class=OwnerLookupRoute)

    if place == "decorator":

        @router.get("/v1/guarded", dependencies=[Depends(get_current_owner)])
        def guarded() -> str:
            return "secret"
    else:

        @router.get("/v1/guarded")
        def guarded(name: Annotated[str, Depends(owner_name)]) -> str:
            return name

    app.include_router(router)

    with pytest.raises(RuntimeError, match=r"/v1/guarded .*take `owner: CurrentOwner` instead"):
        check_owner_routes(app)


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
