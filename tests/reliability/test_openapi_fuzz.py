"""Property-based fuzzing of the whole HTTP API from its own OpenAPI document (schemathesis).

    .venv/bin/python -m pytest tests/reliability/test_openapi_fuzz.py -q

Every operation in `/openapi.json` gets generated requests, well-formed ones (positive mode)
and ones that break the schema (negative mode), sent in-process over ASGI with a real token.
Path parameters name alice's real jobs too: one trained to the end by the worker's own runner
(real checkpoints, real metrics), one cancelled. Each answer must pass schemathesis'
`not_a_server_error` and the conformance checks (status code, content type and body all as
documented): bad input is always a documented 4xx with problem+json, never a 500.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import hypothesis
import pytest
import schemathesis
from api.conftest import alice, api_settings, app  # noqa: F401  (fixtures)
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup

from services.settings import Settings

from .trained_jobs import TINY_SPEC, train_job

# Per operation and generation mode; operations without parameters have only a few distinct
# requests, so hypothesis stops early there. The total is asserted below.
EXAMPLES = {GenerationMode.POSITIVE: 90, GenerationMode.NEGATIVE: 60}
MIN_REQUESTS = 1000
CHECKS = [
    getattr(schemathesis.checks, name)  # registered checks, looked up by name
    for name in (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    )
]
TRAINED_SPEC = {**TINY_SPEC, "name": "fuzz-target ☃"}


@pytest.fixture
def finished_jobs(
    app: FastAPI,  # noqa: F811  (api_settings: no practical failed-token limit)
    alice: dict[str, str],  # noqa: F811
    api_settings: Settings,  # noqa: F811
) -> dict[str, Any]:
    """Alice's trained job (real checkpoints and metrics, by the worker's runner) and a
    cancelled one; both finished, so an event stream on them ends at once."""
    client = TestClient(app)
    trained, steps = train_job(client, alice, api_settings, TRAINED_SPEC)
    cancelled = client.post("/v1/jobs", json=TRAINED_SPEC, headers=alice).json()["id"]
    assert client.post(f"/v1/jobs/{cancelled}/cancel", headers=alice).status_code == 202
    return {"trained": trained, "cancelled": cancelled, "steps": steps}


def case_strategy(operation: Any, mode: GenerationMode, jobs: dict[str, Any], token: str) -> Any:
    """Cases for one operation: with alice's token or a wrong one, and job ids / steps that
    exist as well as generated ones."""
    names = {p.name for p in operation.path_parameters}
    bodies: list[dict[str, Any]] = [{}]
    if operation.label == "POST /v1/jobs":  # generated specs are rarely valid: add one that is
        bodies.append({"body": TRAINED_SPEC, "media_type": "application/json"})
    # An event stream lasts until its job ends: only the trained job, which a resume cannot
    # re-queue (the cancelled one may be resumed by the fuzzer at any time).
    job_ids = [jobs["trained"]]
    if not operation.path.endswith("/events"):
        job_ids.append(jobs["cancelled"])
    fixed: list[dict[str, Any]] = [{}]
    if "job_id" in names:
        fixed += [{"job_id": j} for j in job_ids]
    if "step" in names:
        fixed += [{"job_id": j, "step": s} for j in job_ids for s in jobs["steps"]]
    strategies = [
        operation.as_strategy(
            generation_mode=mode,
            path_parameters=path or None,
            headers={"Authorization": f"Bearer {auth}"},
            **body,
        )
        for path in fixed
        for body in bodies
        for auth in (token, token, token, "accum_not-a-real-token")
    ]
    return st.one_of(strategies)


@pytest.mark.slow
def test_generated_requests_get_documented_answers_and_never_a_5xx(
    app: FastAPI,  # noqa: F811  (api_settings: no practical failed-token limit)
    alice: dict[str, str],  # noqa: F811
    finished_jobs: dict[str, Any],
    database_backend: str,
    record_figure: Any,
) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    token = alice["Authorization"].removeprefix("Bearer ")
    sent: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    violations: dict[str, str] = {}  # the first example of each kind, for the failure message
    violating = 0

    def send_and_check(case: Any) -> None:
        nonlocal violating
        response = case.call()
        sent[case.operation.label] += 1
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as group:
            violating += 1
            for failure in group.exceptions:
                example = f"{response.status_code} {case.as_curl_command()}\n{failure.message[:600]}"
                violations.setdefault(f"{case.operation.label}: {failure.title}", example)

    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        for mode, examples in EXAMPLES.items():
            run = hypothesis.given(case=case_strategy(operation, mode, finished_jobs, token))(
                send_and_check
            )
            try:
                hypothesis.settings(
                    max_examples=examples,
                    deadline=None,
                    database=None,  # no .hypothesis/ directory in the tree
                    derandomize=True,  # the same requests on every run: a failure reproduces
                    suppress_health_check=list(hypothesis.HealthCheck),
                    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
                )(run)()
            except hypothesis.errors.Unsatisfiable:
                # Negative mode has nothing to break where the only inputs are the ones fixed
                # above (ids, token) or there are none (/healthz): positive mode covers those.
                assert mode is GenerationMode.NEGATIVE, operation.label

    total = sum(sent.values())
    server_errors = sum(n for code, n in statuses.items() if code >= 500)
    if database_backend == "postgresql":  # one figure per key; PostgreSQL is the production store
        record_figure(
            "openapi_fuzz",
            area="bad input",
            check="schemathesis from /openapi.json: valid and schema-breaking requests to every "
            "operation, real token, real job/checkpoint/metrics ids",
            figure=f"{total:,} generated requests over {len(operations)} operations: "
            f"{server_errors} x 5xx, {violating} schema violations",
            passed=total >= MIN_REQUESTS and server_errors == 0 and violating == 0,
        )
    assert violations == {}, "\n\n".join(f"{k}\n{v}" for k, v in violations.items())
    assert server_errors == 0
    assert total >= MIN_REQUESTS, f"only {total} requests: {dict(sent)}"
    assert set(sent) == {op.label for op in operations}, "an operation got no request"
