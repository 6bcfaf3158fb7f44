"""Events over HTTP as a JSON list (the live SSE stream is tested against a real server in
test_server.py)."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from accum import parse_sse
from services.api import sse
from services.jobdb import checkpoints, events, leases, metrics
from services.jobdb.models import Job
from services.jobdb.types import utcnow


def test_lifecycle_events_are_listed_oldest_first(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any]
) -> None:
    job_id = submitted["id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=alice)
    client.post(f"/v1/jobs/{job_id}/resume", headers=alice)

    items = client.get(f"/v1/jobs/{job_id}/events", headers=alice).json()["items"]

    assert [e["kind"] for e in items] == ["created", "cancelled", "resumed"]
    assert [e["id"] for e in items] == sorted(e["id"] for e in items)
    assert set(items[0]) >= {"id", "kind", "message", "data", "created_at"}


def test_after_id_returns_only_newer_events(
    client: TestClient,
    alice: dict[str, str],
    submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    first = client.get(f"/v1/jobs/{job_id}/events", headers=alice).json()["items"][-1]["id"]
    with session_factory.begin() as session:
        events.add_event(session, job_id, "oom_backoff", "halved m", {"micro_batch_size": 8})

    items = client.get(
        f"/v1/jobs/{job_id}/events", params={"after_id": first}, headers=alice
    ).json()["items"]

    assert [(e["kind"], e["data"]) for e in items] == [("oom_backoff", {"micro_batch_size": 8})]


def test_stream_of_a_finished_job_replays_its_events_then_ends(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any]
) -> None:
    job_id = submitted["id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=alice)

    response = client.get(
        f"/v1/jobs/{job_id}/events", headers={**alice, "Accept": "text/event-stream"}
    )
    messages = list(parse_sse(iter(response.text.splitlines())))

    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert [e for e, _ in messages] == ["status", "job_event", "job_event", "end"]
    assert messages[0][1]["id"] == job_id and messages[0][1]["status"] == "cancelled"
    assert [d["kind"] for e, d in messages if e == "job_event"] == ["created", "cancelled"]
    assert messages[-1][1] == {"status": "cancelled"}
    created_id = messages[1][1]["id"]
    assert f"id: {created_id}\nevent: job_event\n" in response.text

    # An EventSource reconnecting after the first event gets only what followed it.
    again = client.get(
        f"/v1/jobs/{job_id}/events",
        headers={**alice, "Accept": "text/event-stream", "Last-Event-ID": str(created_id)},
    )
    kinds = [d["kind"] for e, d in parse_sse(iter(again.text.splitlines())) if e == "job_event"]
    assert kinds == ["cancelled"]


def test_a_quiet_stream_sends_keep_alive_comments(
    submitted: dict[str, Any], session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sse, "KEEP_ALIVE_S", 0.05)
    monkeypatch.setattr(sse, "POLL_INTERVAL_S", 0.02)

    async def first_chunks(count: int) -> list[bytes]:
        with session_factory() as session:
            state = sse.open_stream(session, session.get(Job, submitted["id"]))  # type: ignore[arg-type]
        stream = sse.job_stream(session_factory, submitted["id"], state)
        chunks = [chunk async for chunk, _ in zip_count(stream, count)]
        await stream.aclose()  # type: ignore[attr-defined]
        return chunks

    chunks = anyio.run(first_chunks, 3)

    assert chunks[0].startswith(b"event: status\n")
    assert b"event: job_event\n" in chunks[0]
    assert chunks[1:] == [sse.KEEP_ALIVE, sse.KEEP_ALIVE]


async def zip_count(stream: Any, count: int) -> Any:
    index = 0
    async for chunk in stream:
        yield chunk, index
        index += 1
        if index == count:
            return


def test_stream_resends_the_steps_a_restarted_attempt_rewrites(
    submitted: dict[str, Any], session_factory: sessionmaker[Session]
) -> None:
    job_id, start = submitted["id"], utcnow()
    with session_factory.begin() as session:
        leases.claim_job(session, job_id, "w1", "h", None, lease_timeout_s=60, now=start)
        metrics.write_metrics(session, job_id, 1, [{"name": "loss", "step": s, "value": 1.0 / s} for s in range(1, 6)])
        checkpoints.add_checkpoint(session, job_id, 2, "/nowhere/2.pt", 1, "0" * 64)
    with session_factory() as session:
        state = sse.open_stream(session, session.get(Job, job_id))  # type: ignore[arg-type]
    first, _ = sse.poll(session_factory, job_id, state)
    # w1 dies; w2 takes the job over from checkpoint step 2 and logs steps 3 and 4 again.
    with session_factory.begin() as session:
        later = start + timedelta(seconds=120)
        assert leases.claim_job(session, job_id, "w2", "h", None, lease_timeout_s=60, now=later)
        metrics.delete_metrics_after(session, job_id, 2)
        metrics.write_metrics(session, job_id, 2, [{"name": "loss", "step": s, "value": 9.0} for s in (3, 4)])
    second, _ = sse.poll(session_factory, job_id, state)

    assert not any(m.startswith(b"event: metric") for m in first)  # history is not replayed
    resent = [m for m in second if m.startswith(b"event: metric")]
    assert [json.loads(m.split(b"data: ")[1])["step"] for m in resent] == [3, 4]
    assert all(json.loads(m.split(b"data: ")[1])["value"] == 9.0 for m in resent)


def test_a_poll_sends_the_final_outcome_after_the_metrics_written_before_it(
    submitted: dict[str, Any], session_factory: sessionmaker[Session]
) -> None:
    job_id = submitted["id"]
    with session_factory() as session:
        state = sse.open_stream(session, session.get(Job, job_id))  # type: ignore[arg-type]
    with session_factory.begin() as session:
        leases.claim_job(session, job_id, "w1", "h", None, lease_timeout_s=60, now=utcnow())
        metrics.write_metrics(session, job_id, 1, [{"name": "val_accuracy", "step": 7, "value": 0.9}])
        leases.finish_job(session, job_id, "w1", "succeeded")
    messages, finished = sse.poll(session_factory, job_id, state)

    kinds = [
        "metric" if m.startswith(b"event: metric") else json.loads(m.split(b"data: ")[1]).get("kind", "")
        for m in messages
        if m.startswith((b"event: metric", b"id:", b"event: job_event"))
    ]
    assert finished and "metric" in kinds and "succeeded" in kinds
    assert kinds.index("metric") < kinds.index("succeeded")


def test_a_diverged_run_streams_nan_and_infinities_as_valid_json(
    submitted: dict[str, Any], session_factory: sessionmaker[Session]
) -> None:
    """A bare NaN in a `data:` line would make a browser's JSON.parse throw and drop the
    stream: non-finite values go out as null with their label, in metrics and job objects."""
    job_id = submitted["id"]
    with session_factory() as session:
        state = sse.open_stream(session, session.get(Job, job_id))  # type: ignore[arg-type]
    with session_factory.begin() as session:
        leases.claim_job(session, job_id, "w1", "h", None, lease_timeout_s=60, now=utcnow())
        metrics.write_metrics(session, job_id, 1, [
            {"name": "loss", "step": s, "value": v}
            for s, v in [(1, 0.5), (2, math.nan), (3, math.inf), (4, -math.inf)]
        ])
        leases.update_progress(session, job_id, {"optimizer_step": 2}, {"loss": math.nan}, "w1")
    messages, _ = sse.poll(session_factory, job_id, state)

    decoded = [
        (m.split(b"\n")[0].removeprefix(b"event: ").decode(), json.loads(m.split(b"data: ")[1]))
        for m in messages if m.startswith(b"event: ")
    ]
    for message in messages:  # strict JSON, as a browser parses it: no bare NaN or Infinity
        json.loads(message.split(b"data: ")[1], parse_constant=reject_constant)
    points = [(d["step"], d["value"], d.get("nonfinite")) for e, d in decoded if e == "metric"]
    assert points == [(1, 0.5, None), (2, None, "NaN"), (3, None, "inf"), (4, None, "-inf")]
    status = next(d for e, d in decoded if e == "status")
    assert status["latest_metrics"]["loss"] is None
    assert status["nonfinite_metrics"] == {"loss": "NaN"}


def reject_constant(name: str) -> float:
    raise AssertionError(f"{name} is not JSON")
