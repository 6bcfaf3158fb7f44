"""`GET /metrics`: Prometheus text with jobs by status, queue depth per queue, and a request
latency histogram labelled by route template (never by raw path)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_prometheus_text_has_jobs_queue_depth_and_latency(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    jobs = [client.post("/v1/jobs", json={**spec, "seed": i}, headers=alice).json() for i in range(3)]
    client.post("/v1/jobs", json={**spec, "queue": "a100"}, headers=alice)
    client.post(f"/v1/jobs/{jobs[0]['id']}/cancel", headers=alice)
    client.get(f"/v1/jobs/{jobs[1]['id']}", headers=alice)
    client.get(f"/v1/jobs/{jobs[2]['id']}", headers=alice)

    response = client.get("/metrics")
    values = samples(response.text)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert values[("accum_jobs", (("status", "queued"),))] == 3
    assert values[("accum_jobs", (("status", "cancelled"),))] == 1
    assert values[("accum_jobs", (("status", "running"),))] == 0
    assert values[("accum_queue_depth", (("queue", "default"),))] == 2
    assert values[("accum_queue_depth", (("queue", "a100"),))] == 1
    read_one = (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "200"))
    assert values[("accum_http_request_duration_seconds_count", read_one)] == 2
    submit = (("method", "POST"), ("route", "/v1/jobs"), ("status", "201"))
    assert values[("accum_http_request_duration_seconds_count", submit)] == 4
    assert not any(jobs[1]["id"] in label for (_, labels) in values for _, label in labels)
