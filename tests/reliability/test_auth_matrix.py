"""Every /v1 route x three actors (owner A, owner B, an admin) on owner A's real jobs and tokens.

    .venv/bin/python -m pytest tests/reliability/test_auth_matrix.py -q

The routes are read from the app itself, so a /v1 route added later fails this test until it
has a row in EXPECTED. A's jobs are real: one trained to the end by the worker's own runner
(checkpoints, metrics, events), plus, for each actor, a fresh queued job (the cancel target)
and a fresh cancelled one (the resume target), so a refusal cannot be mistaken for a 409.
B must get 404 on every route that names A's job (or A's token, by prefix), with the same
body as one that never existed (existence is not revealed), and A's jobs and live tokens
must be exactly as they were afterwards; A and the admin get the route's success status.
Runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pytest
from api.conftest import admin, alice, api_settings, app, bob, client  # noqa: F401  (fixtures)
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from services.api.main import ROUTERS
from services.jobdb import checkpoints as store_checkpoints
from services.jobdb import tokens as store_tokens
from services.jobdb.models import ApiToken, Checkpoint, Job, JobEvent, Metric
from services.jobdb.types import new_id
from services.settings import Settings

from .trained_jobs import TINY_SPEC, train_job

SPEC = TINY_SPEC
SSE = {"Accept": "text/event-stream"}


@dataclass(frozen=True)
class Expect:
    """What a route does for A and the admin (`ok`), on which of A's jobs (`target`: None for
    routes that name no job, where B gets `ok` too), with which header variants."""

    ok: int
    target: str | None = None
    variants: tuple[dict[str, str], ...] = ({},)
    admin_only: bool = False  # owners A and B get 403


EXPECTED: dict[tuple[str, str], Expect] = {
    ("POST", "/v1/jobs"): Expect(201),
    ("GET", "/v1/jobs"): Expect(200),
    ("GET", "/v1/jobs/{job_id}"): Expect(200, "trained"),
    ("PATCH", "/v1/jobs/{job_id}"): Expect(200, "trained"),
    ("POST", "/v1/jobs/{job_id}/cancel"): Expect(202, "queued"),
    ("POST", "/v1/jobs/{job_id}/resume"): Expect(202, "cancelled"),
    ("GET", "/v1/jobs/{job_id}/metrics"): Expect(200, "trained"),
    ("GET", "/v1/jobs/{job_id}/events"): Expect(200, "trained", ({}, SSE)),
    ("GET", "/v1/jobs/{job_id}/logs"): Expect(200, "trained", ({}, SSE)),
    ("GET", "/v1/jobs/{job_id}/checkpoints"): Expect(200, "trained"),
    ("GET", "/v1/jobs/{job_id}/checkpoints/{step}"): Expect(200, "trained"),
    # The trained job has no LoRA adapters to merge: A and the admin get that 404, B the unknown one.
    ("GET", "/v1/jobs/{job_id}/merged"): Expect(404, "trained"),
    ("GET", "/v1/catalog/models"): Expect(200),
    ("GET", "/v1/catalog/datasets"): Expect(200),
    ("GET", "/v1/me"): Expect(200),
    ("GET", "/v1/tokens"): Expect(200),
    ("POST", "/v1/tokens"): Expect(201, admin_only=True),
    ("DELETE", "/v1/tokens/{prefix}"): Expect(204, "token"),
    ("DELETE", "/v1/jobs/{job_id}"): Expect(204, "doomed"),
    ("GET", "/v1/workers"): Expect(200),
}
# The request bodies of the routes that take one.
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/jobs"): SPEC,
    ("PATCH", "/v1/jobs/{job_id}"): {"notes": "seen by its owner and the admin only", "tags": ["matrix"]},
}
# What each action does to its target when it succeeds (A and the admin).
AFTER_ACTION = {"queued": "cancelled", "cancelled": "queued", "token": "revoked"}
UNKNOWN_PREFIX = "accum_zzzzzz"


def v1_routes(api: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every /v1 operation: the app's OpenAPI document, and the routers the
    app includes (which also holds routes left out of the document)."""
    documented = {
        (method.upper(), path)
        for path, operations in api.openapi()["paths"].items()
        for method in operations
    }
    routed = {
        (method, route.path)
        for router in ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    return {(m, p) for m, p in documented | routed if p.startswith("/v1")}


def test_every_v1_route_of_the_app_is_in_the_matrix(app: FastAPI) -> None:  # noqa: F811
    routes = v1_routes(app)

    missing = sorted(routes - EXPECTED.keys())
    stale = sorted(EXPECTED.keys() - routes)
    assert not missing, f"add these /v1 routes to EXPECTED in {__file__}: {missing}"
    assert not stale, f"EXPECTED names routes the app no longer has: {stale}"


@pytest.fixture
def trained_job(
    client: TestClient,  # noqa: F811
    alice: dict[str, str],  # noqa: F811
    api_settings: Settings,  # noqa: F811
    session_factory: sessionmaker[Session],
) -> tuple[str, int]:
    """A's job trained to the end by the worker's runner; (id, a checkpoint step)."""
    job_id, steps = train_job(client, alice, api_settings)
    with session_factory() as session:
        metrics = session.scalar(select(func.count()).where(Metric.job_id == job_id))
    assert metrics, "the trained job left no metrics"
    return job_id, steps[-1]


def owned_state(session_factory: sessionmaker[Session], owner_id: int) -> dict[str, Any]:
    """Everything of one owner's jobs and tokens an action could change: job rows and child
    row counts; each token's prefix with "live" or "revoked"."""

    def count(model: Any, job_id: str) -> int:
        return int(session.scalar(select(func.count()).where(model.job_id == job_id)) or 0)

    with session_factory() as session:
        jobs = session.scalars(select(Job).where(Job.owner_id == owner_id).order_by(Job.id))
        state: dict[str, Any] = {
            job.id: (
                job.status, job.updated_at, job.attempts, job.resume_step, job.finished_at,
                job.enqueued_at, count(JobEvent, job.id), count(Metric, job.id),
                count(Checkpoint, job.id),
            )
            for job in jobs
        }
        for prefix, revoked_at in session.execute(
            select(ApiToken.prefix, ApiToken.revoked_at).where(ApiToken.owner_id == owner_id)
        ):
            state[prefix] = ("revoked" if revoked_at else "live",)
        return state


def spare_token_prefix(session_factory: sessionmaker[Session], owner_name: str) -> str:
    """The prefix of a new token of ``owner_name``: the target a revoke may take away."""
    with session_factory.begin() as session:
        _, token = store_tokens.create_owner_with_token(session, owner_name)
    return token[: store_tokens.PREFIX_LENGTH]


def not_found_body(response: Any, job_id: str) -> dict[str, Any]:
    body = dict(response.json())
    body["detail"] = body.get("detail", "").replace(job_id, "<id>")
    return body


def test_no_route_lets_another_owner_see_or_touch_a_job(
    client: TestClient,  # noqa: F811
    alice: dict[str, str],  # noqa: F811
    bob: dict[str, str],  # noqa: F811
    admin: dict[str, str],  # noqa: F811
    session_factory: sessionmaker[Session],
    trained_job: tuple[str, int],
    record_figure: Any,
    database_backend: str,
) -> None:
    trained, step = trained_job
    with session_factory() as session:
        alice_id = session.scalar(select(Job.owner_id).where(Job.id == trained))
    assert alice_id is not None
    actors = {"B": bob, "A": alice, "admin": admin}
    requests = cross_owner_successes = refused_as_unknown = 0
    named_routes = [r for r in EXPECTED.values() if r.target]

    for actor, headers in actors.items():
        queued = client.post("/v1/jobs", json=SPEC, headers=alice).json()["id"]
        cancelled = client.post("/v1/jobs", json=SPEC, headers=alice).json()["id"]
        assert client.post(f"/v1/jobs/{cancelled}/cancel", headers=alice).status_code == 202
        doomed = client.post("/v1/jobs", json=SPEC, headers=alice).json()["id"]  # deleted
        assert client.post(f"/v1/jobs/{doomed}/cancel", headers=alice).status_code == 202
        token = spare_token_prefix(session_factory, "alice")
        targets = {"trained": trained, "queued": queued, "cancelled": cancelled, "token": token,
                   "doomed": doomed}
        before = owned_state(session_factory, alice_id)

        for (method, path), expect in EXPECTED.items():
            target_id = targets[expect.target] if expect.target else None
            for variant in expect.variants:
                url = path.format(job_id=target_id, step=step, prefix=target_id)
                body = BODIES.get((method, path))
                response = client.request(method, url, headers={**headers, **variant}, json=body)
                requests += 1
                where = (actor, method, url, variant, response.text[:300])
                if actor == "B" and target_id is not None:
                    cross_owner_successes += response.is_success
                    unknown_id = UNKNOWN_PREFIX if expect.target == "token" else new_id()
                    unknown = client.request(
                        method, url.replace(target_id, unknown_id), headers={**headers, **variant},
                        json=body,
                    )
                    assert response.status_code == 404, where
                    assert not_found_body(response, target_id) == not_found_body(
                        unknown, unknown_id
                    ), where
                    refused_as_unknown += 1
                    continue
                ok = 403 if expect.admin_only and actor != "admin" else expect.ok
                assert response.status_code == ok, where
                if (method, path) == ("GET", "/v1/jobs"):
                    listed = {j["id"] for j in response.json()["items"]}
                    if actor == "B":
                        cross_owner_successes += bool(listed & set(before))
                        assert not listed & set(before), where
                    else:
                        assert trained in listed, where
                if path.endswith("/checkpoints/{step}"):
                    with session_factory() as session:
                        row = store_checkpoints.get_checkpoint(session, trained, step)
                    assert row is not None
                    assert hashlib.sha256(response.content).hexdigest() == row.sha256, where

        after = owned_state(session_factory, alice_id)
        if actor == "B":
            assert after == before, "owner B's requests changed owner A's jobs or tokens"
        else:
            for target, status in AFTER_ACTION.items():
                assert after[targets[target]][0] == status, (actor, target)
            assert doomed not in after, (actor, "a deleted job is gone")

    assert cross_owner_successes == 0
    record_figure(
        "auth_matrix",
        area="auth",
        check=f"owner A, owner B and an admin on every /v1 route of the app, on A's real jobs "
        f"(trained, queued, cancelled); {database_backend}",
        figure=f"3 actors x {len(EXPECTED)} routes ({requests} requests): "
        f"{cross_owner_successes} cross-owner successes; B got 404 on "
        f"{refused_as_unknown}/{refused_as_unknown} requests naming A's jobs or tokens, same "
        f"body as for an unknown one, A's jobs and tokens unchanged; A and admin succeeded on "
        f"all {len(named_routes)} routes that name a job or token",
        passed=cross_owner_successes == 0,
    )
