"""`GET /metrics`: Prometheus text with jobs by status, queue depth per queue, a request
latency histogram labelled by route template (never by raw path), lifecycle counters by
cause, failed token checks and open streams."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from services.api.main import create_app
from services.jobdb import events, leases
from services.jobdb.types import utcnow
from services.settings import Settings

from ..helpers import claim


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


def test_lifecycle_counters_come_from_the_event_log_with_their_causes(
    client: TestClient,
    alice: dict[str, str],
    spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    """What workers and reapers did (restarts, expiries, failures by reason), read from the
    event log at scrape time; failed token checks and open streams of this process."""
    ids = [client.post("/v1/jobs", json={**spec, "seed": i}, headers=alice).json()["id"] for i in range(3)]
    later = utcnow() + timedelta(hours=1)
    for job_id in ids[:2]:  # two attempts of each lost without a checkpoint: the 2nd is poison
        for worker in ("w1", "w2"):
            claim(session_factory, job_id, worker_id=worker)
            with session_factory.begin() as session:
                leases.reap_expired_leases(session, now=later)
    claim(session_factory, ids[2], worker_id="w3")
    with session_factory.begin() as session:
        error = {"type": "JobTimeout", "reason": "timeout", "message": "ran past its timeout"}
        assert leases.finish_job(session, ids[2], "w3", "failed", error=error)
    with session_factory.begin() as session:  # what a prefork worker records (process_death.py)
        for cause in ("killed by signal 9 (SIGKILL)",
                      "out of memory (the kernel's OOM killer): killed by signal 9 (SIGKILL)",
                      "killed by signal 11 (SIGSEGV)", "killed by signal 9 (SIGKILL)", "exited with code 3"):
            events.add_event(session, ids[0], "process_died", cause, {"cause": cause})
        # What the worker records when a node of a gang was lost (leases.requeue_after_fault).
        events.add_event(session, ids[2], "requeued", "node lost", {"restart": 1, "reason": "node_lost"})
    for _ in range(2):
        client.get("/v1/jobs", headers={"Authorization": "Bearer accum_nope"})
    client.app.state.stream_slots.try_open(1)  # type: ignore[attr-defined]

    values = samples(client.get("/metrics").text)

    def counter(name: str, label: str, value: str) -> float:
        return values[(f"accum_{name}_total", ((label, value),))]

    assert counter("job_transitions", "kind", "created") == 3
    assert counter("job_transitions", "kind", "started") == 5
    assert counter("job_restarts", "cause", "lease_expired") == 2
    assert counter("job_restarts", "cause", "worker_shutdown") == 0
    assert counter("job_restarts", "cause", "node_lost") == 1  # by its own name (issue 42)
    assert counter("lease_expiries", "cause", "no_progress") == 4
    assert counter("job_failures", "reason", "poison") == 2
    assert counter("job_failures", "reason", "timeout") == 1
    assert counter("process_deaths", "cause", "SIGKILL") == 2
    assert counter("process_deaths", "cause", "oom_killer") == 1
    assert counter("process_deaths", "cause", "SIGSEGV") == 1
    assert counter("process_deaths", "cause", "exit_code") == 1
    assert counter("auth_failures", "answer", "401") == 2
    assert values[("accum_event_streams", ())] == 1


def test_artifact_store_gauges_come_from_checkpoint_and_fault_events(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], session_factory: Any
) -> None:
    from services.jobdb import checkpoints, events

    with session_factory.begin() as session:
        checkpoints.add_checkpoint(session, submitted["id"], 5, f"{submitted['id']}/5.pt", 1000, "a" * 64)
        checkpoints.add_checkpoint(session, submitted["id"], 9, f"{submitted['id']}/9.pt", 3000, "b" * 64)
        events.add_event(session, submitted["id"], "checkpoint", "checkpoint at step 9",
                         {"step": 9, "size_bytes": 3000, "upload_s": 0.25})
        events.add_event(session, submitted["id"], "store_fault", "s3://b/p: unreachable", {})

    values = samples(client.get("/metrics").text)

    assert values[("accum_artifact_stored_bytes", ())] == 4000
    # Uploads are measured once, by the workers' histograms (tests/worker/test_worker_metrics_endpoint.py).
    assert ("accum_checkpoint_upload_seconds", ()) not in values
    assert values[("accum_artifact_store_errors", (("source", "workers"),))] == 1
    assert values[("accum_artifact_store_errors", (("source", "api"),))] == 0


def test_metrics_want_the_scrapers_token_when_the_operator_sets_one(api_settings: Settings) -> None:
    """ACCUM_METRICS_TOKEN (issue 42 item 4): no token or a wrong one is 401 saying what to
    send; an owner's API token is no scraper's token."""
    settings = api_settings.model_copy(update={"metrics_token": SecretStr("scrape-me")})
    with TestClient(create_app(settings, run_reaper=False)) as client:
        refused = client.get("/metrics")
        wrong = client.get("/metrics", headers={"Authorization": "Bearer scrape-you"})
        scraped = client.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
    assert refused.status_code == wrong.status_code == 401
    assert "ACCUM_METRICS_TOKEN" in refused.json()["detail"] and "scrape-me" not in refused.text
    assert scraped.status_code == 200 and "accum_jobs" in scraped.text
