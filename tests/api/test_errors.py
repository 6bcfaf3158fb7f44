"""services.api.errors: every error answer is RFC 9457 problem+json.

Most tests run a tiny app with one route per kind of failure, plus the real `JobSpec` as a
body, so the 422 shape (dotted field path, allowed values) is checked end to end through
FastAPI; the database ones run the real app (503 for an outage, 500 for a bug).
(A real PostgreSQL restart under a real API is tests/reliability/test_postgres_restart.py.)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import pytest
from fastapi import FastAPI, HTTPException, Query
from fastapi.testclient import TestClient
from job_specs import MINIMAL_SPEC
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError

from services.api.errors import PROBLEM_JSON, Problem, install_error_handlers, validation_problem
from services.api.main import create_app
from services.catalog import served_names
from services.ports import free_port
from services.settings import Settings
from services.spec import JobSpec, parse_spec


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/jobs")
    def submit(spec: JobSpec) -> dict[str, Any]:
        return spec.normalised()

    @app.post("/raw")
    def submit_raw(body: dict[str, Any]) -> dict[str, Any]:
        try:
            return parse_spec(body).normalised()
        except ValidationError as exc:
            raise validation_problem(exc.errors(include_url=False), ("body",)) from exc

    @app.get("/items")
    def items(
        status: Literal["queued", "running"] = "queued", limit: int = Query(10, gt=0)
    ) -> dict[str, Any]:
        return {"status": status, "limit": limit}

    @app.get("/secret")
    def secret() -> None:
        raise HTTPException(401, detail="missing Authorization header")

    @app.get("/conflict")
    def conflict() -> None:
        raise Problem(409, "Conflict", "job is finished", job_id="abc")

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("database exploded with secret dsn")

    return app


@pytest.fixture(scope="module")
def client() -> TestClient:
    # The server re-raises unexpected errors for logging; the client must still get a body.
    return TestClient(make_app(), raise_server_exceptions=False)


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body = response.json()
    assert body["status"] == status
    assert body["title"] and body["type"] == "about:blank"
    return body


def test_valid_spec_passes_through(client: TestClient) -> None:
    assert client.post("/jobs", json=MINIMAL_SPEC).json()["name"] == "mlp-digits"


def test_422_names_the_dotted_field_path(client: TestClient) -> None:
    body = assert_problem(
        client.post("/jobs", json={**MINIMAL_SPEC, "optimizer": {"name": "sgd", "lr": -1}}), 422
    )
    assert [e["loc"] for e in body["errors"]] == ["body.optimizer.lr"]
    assert "body.optimizer.lr" in body["detail"]
    assert body["errors"][0]["msg"] and body["errors"][0]["type"]


@pytest.mark.parametrize(
    ("change", "loc", "names"),
    [
        ({"model": "nope"}, "body.model", served_names("model")),
        ({"dataset": {"name": "nope"}}, "body.dataset", served_names("dataset")),
        ({"precision": "fp64"}, "body.precision", ["fp32", "bf16", "fp16"]),
        ({"optimizer": {"name": "lamb", "lr": 1}}, "body.optimizer.name", ["sgd", "adamw", "adamw8bit"]),
        ({"scheduler": "linear"}, "body.scheduler.name", ["none", "cosine", "step"]),
    ],
)
def test_422_lists_allowed_values_for_closed_sets(
    client: TestClient, change: dict[str, Any], loc: str, names: list[str]
) -> None:
    body = assert_problem(client.post("/jobs", json={**MINIMAL_SPEC, **change}), 422)
    (error,) = body["errors"]
    assert error["loc"] == loc
    assert error["allowed"] == names


def test_422_reports_every_error_and_open_fields_have_no_allowed_list(client: TestClient) -> None:
    body = assert_problem(
        client.post("/jobs", json={**MINIMAL_SPEC, "epochs": 0, "surprise": 1, "micro_batch_size": -2}),
        422,
    )
    assert {e["loc"] for e in body["errors"]} == {
        "body.epochs",
        "body.surprise",
        "body.micro_batch_size",
    }
    by_loc = {e["loc"]: e for e in body["errors"]}
    assert "allowed" not in by_loc["body.epochs"] and "allowed" not in by_loc["body.micro_batch_size"]
    # An unknown field's allowed values are the names of its mapping's fields.
    assert {"epochs", "micro_batch_size", "optimizer"} <= set(by_loc["body.surprise"]["allowed"])
    assert body["detail"].startswith("3 invalid fields")


def test_pydantic_literal_errors_outside_the_spec_get_allowed_too(client: TestClient) -> None:
    body = assert_problem(client.get("/items", params={"status": "bogus"}), 422)
    assert body["errors"] == [
        {
            "loc": "query.status",
            "msg": body["errors"][0]["msg"],
            "type": "literal_error",
            "allowed": ["queued", "running"],
        }
    ]
    assert (
        assert_problem(client.get("/items", params={"limit": 0}), 422)["errors"][0]["loc"]
        == "query.limit"
    )


def test_hand_validated_body_gives_the_same_shape(client: TestClient) -> None:
    via_model = client.post("/jobs", json={**MINIMAL_SPEC, "model": "nope"}).json()
    by_hand = assert_problem(client.post("/raw", json={**MINIMAL_SPEC, "model": "nope"}), 422)
    assert by_hand["errors"] == via_model["errors"]


@pytest.mark.parametrize("payload", [b"{not json", b'{"model": "mlp",}', b"[1, 2"])
def test_malformed_json_is_400(client: TestClient, payload: bytes) -> None:
    body = assert_problem(
        client.post("/jobs", content=payload, headers={"content-type": "application/json"}), 400
    )
    assert "JSON" in body["detail"]


def test_nan_literal_in_json_is_422_not_500(client: TestClient) -> None:
    payload = b'{"model": "mlp", "dataset": "digits", "micro_batch_size": 16, "accumulation_steps": 4, "epochs": 1, "optimizer": {"name": "sgd", "lr": NaN}}'
    body = assert_problem(
        client.post("/jobs", content=payload, headers={"content-type": "application/json"}), 422
    )
    assert [e["loc"] for e in body["errors"]] == ["body.optimizer.lr"]


def test_empty_body_is_422(client: TestClient) -> None:
    assert assert_problem(client.post("/jobs"), 422)["errors"][0]["loc"] == "body"


def test_404_and_405_are_problems(client: TestClient) -> None:
    assert "GET /no/such/route" in assert_problem(client.get("/no/such/route"), 404)["detail"]
    response = client.delete("/jobs")
    assert "POST" in assert_problem(response, 405)["detail"]
    assert response.headers["allow"] == "POST"


def test_401_keeps_detail_and_bearer_challenge(client: TestClient) -> None:
    response = client.get("/secret")
    body = assert_problem(response, 401)
    assert response.headers["www-authenticate"] == "Bearer"
    assert body["detail"] == "missing Authorization header"


def test_raised_problem_carries_extension_members(client: TestClient) -> None:
    body = assert_problem(client.get("/conflict"), 409)
    assert body == {
        "type": "about:blank",
        "title": "Conflict",
        "status": 409,
        "detail": "job is finished",
        "job_id": "abc",
    }


def test_unexpected_error_is_500_problem_with_an_id_and_no_internals(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("ERROR", logger="services.api.errors"):
        body = assert_problem(client.get("/boom"), 500)
    assert len(body["error_id"]) == 32 and body["error_id"] in body["detail"]
    assert "secret" not in str(body)
    assert any(body["error_id"] in record.getMessage() for record in caplog.records)


# A well-formed token: the lookup, the request's first statement, meets the outage.
TOKEN = {"Authorization": "Bearer accum_" + "x" * 43}


def test_requests_while_the_database_is_down_get_503_with_retry_after(tmp_path: Path) -> None:
    down = Settings(home=tmp_path, database_url=f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/accum")  # nothing listens
    with TestClient(create_app(down, run_reaper=False), raise_server_exceptions=False) as client:
        for method, path, body in [("GET", "/v1/jobs", None), ("POST", "/v1/jobs", MINIMAL_SPEC),
                                   ("GET", "/v1/jobs/0123456789abcdefghjkmnpqrs", None),
                                   # invalid body: the token is looked up before the 422
                                   ("POST", "/v1/jobs", {"model": "mlp"})]:
            started = time.monotonic()
            response = client.request(method, path, json=body, headers=TOKEN)
            elapsed = time.monotonic() - started
            assert response.status_code == 503, (method, path, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            assert int(response.headers["retry-after"]) > 0
            problem = response.json()
            assert problem["status"] == 503 and "retry" in problem["detail"]
            assert elapsed < 3, f"{method} {path} took {elapsed:.1f} s with the database down"


def test_a_database_error_that_is_not_an_outage_stays_a_500(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path), run_reaper=False)

    def violate() -> None:
        raise IntegrityError("INSERT INTO jobs ...", {}, Exception("duplicate key"))

    app.add_api_route("/test-only/violation", violate)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/test-only/violation")
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert "error_id" in response.json()
