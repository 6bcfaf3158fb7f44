"""Fuzz-lite: junk bodies, parameters and paths must never produce a 500 (bad input is
always the client's error, answered 4xx with problem+json)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from job_specs import MINIMAL_SPEC

JUNK_VALUES: list[Any] = [
    None, True, -1, 0, 2**70, -(2**70), 1e308, "", "x" * 5000, "\x00", "☃", [], {}, [1, "a"],
    {"name": None}, {"": ""}, "auto", "Infinity", "NaN",
]

JUNK_BODIES: list[bytes] = [
    b"", b"null", b"[]", b"42", b'"spec"', b"{}", b"{" * 2000 + b"}" * 2000, b"[" * 5000,
    b'{"model": }', b"\x80\x81\x82", b'{"model": "mlp"' + b', "a": 1' * 10 + b"}",
    json.dumps({"optimizer": {"lr": {"lr": {"lr": 1}}}}).encode(),
]

JUNK_PATHS = [
    "/v1/jobs/%00", "/v1/jobs/" + "a" * 3000, "/v1/jobs/..%2F..%2Fetc%2Fpasswd", "/v1/jobs/☃/metrics",
    "/v1/jobs/x/checkpoints/-1", "/v1/jobs/x/checkpoints/99999999999999999999999",
    "/v1/jobs/x/checkpoints/1.5", "/v1/nothing", "/v1/jobs/x/events?after_id=-5",
    "/v1/jobs?limit=-1&limit=abc", "/v1/jobs?cursor=" + "%FF" * 50, "/v1/jobs?cursor=WyJcdTAwMDAiXQ", "/v1/jobs?status=",
    "/v1/jobs/x/metrics?max_points=0&since_step=abc", "/v1/catalog/planets",
]


def test_junk_never_yields_a_500(client: TestClient, alice: dict[str, str], submitted: dict[str, Any]) -> None:
    answers: list[tuple[str, int]] = []
    for field in list(MINIMAL_SPEC) + ["queue", "name", "scheduler", "gpus", "seed"]:
        for value in JUNK_VALUES:
            response = client.post("/v1/jobs", json={**MINIMAL_SPEC, field: value}, headers=alice)
            answers.append((f"{field}={value!r:.40}", response.status_code))
    for body in JUNK_BODIES:
        response = client.post(
            "/v1/jobs", content=body, headers={**alice, "Content-Type": "application/json"}
        )
        answers.append((f"body {body[:40]!r}", response.status_code))
    for path in JUNK_PATHS:
        for method in ("GET", "POST", "DELETE"):
            answers.append((f"{method} {path[:60]}", client.request(method, path, headers=alice).status_code))
    job = f"/v1/jobs/{submitted['id']}"
    for params in ({"limit": "1e9"}, {"name": "\x00"}, {"since_step": 2**80}, {"max_points": "x"}):
        answers.append((f"metrics {params}", client.get(f"{job}/metrics", params=params, headers=alice).status_code))
    for path in ("/checkpoints/99999999999999999999999", "/checkpoints/-3", "/events?after_id=99999999999999999999"):
        answers.append((path, client.get(job + path, headers=alice).status_code))

    server_errors = [(what, code) for what, code in answers if code >= 500]
    assert server_errors == []
    assert len(answers) > 250  # the table above really ran
