"""A real uvicorn process on a free port, talked to with httpx: start-up, auth, and the live
SSE stream (an event and metrics written after the stream opened arrive, then `end`)."""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from job_specs import MINIMAL_SPEC
from sqlalchemy.orm import Session, sessionmaker

from accum import parse_sse
from services.jobdb import events, leases, metrics, tokens
from services.ports import free_port
from services.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(api_settings: Settings) -> Iterator[str]:
    """`uvicorn services.api.main:app` with the test's store; yields its base URL."""
    with serve(api_settings) as url:
        yield url


@contextlib.contextmanager
def serve(api_settings: Settings, **settings: str) -> Iterator[str]:
    """A uvicorn process with the test's store and `settings` (`max_streams_per_owner="2"`
    is ACCUM_MAX_STREAMS_PER_OWNER=2); yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "ACCUM_HOME": str(api_settings.home),
        "ACCUM_DATABASE_URL": api_settings.database_url,
        "ACCUM_BROKER_URL": api_settings.broker_url,
        **{f"ACCUM_{name.upper()}": value for name, value in settings.items()},
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "services.api.main:app", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                output = process.stdout.read().decode() if process.stdout else ""
                pytest.fail(f"uvicorn did not come up: {output}")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def read_stream(url: str, headers: dict[str, str], out: queue.Queue[tuple[str, dict[str, Any]]]) -> None:
    try:
        with httpx.stream("GET", url, headers={**headers, "Accept": "text/event-stream"}, timeout=30) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            for event, data in parse_sse(response.iter_lines()):
                out.put((event, data))
    except httpx.RemoteProtocolError:  # the server stopped under an open stream (teardown)
        out.put(("cut", {}))
    out.put(("closed", {}))


def next_of(messages: queue.Queue[tuple[str, dict[str, Any]]], kind: str) -> dict[str, Any]:
    while True:
        event, data = messages.get(timeout=15)
        if event == kind:
            return data


def test_live_stream_over_a_real_server(
    server: str, session_factory: sessionmaker[Session]
) -> None:
    with session_factory.begin() as session:
        _, token = tokens.create_owner_with_token(session, "alice")
    headers = {"Authorization": f"Bearer {token}"}
    created = httpx.post(f"{server}/v1/jobs", json=MINIMAL_SPEC, headers=headers, timeout=10)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert httpx.get(f"{server}/v1/jobs/{job_id}", timeout=10).status_code == 401

    messages: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
    reader = threading.Thread(
        target=read_stream, args=(f"{server}/v1/jobs/{job_id}/events", headers, messages), daemon=True
    )
    reader.start()
    assert next_of(messages, "status")["status"] == "queued"  # the stream is open

    # Now play the worker: start, log two steps of metrics and an event, succeed.
    with session_factory.begin() as session:
        leases.claim_job(session, job_id, worker_id="w1", host="node", gpu=None, lease_timeout_s=60)
    assert next_of(messages, "status")["status"] == "running"
    with session_factory.begin() as session:
        metrics.write_metrics(session, job_id, 1, metrics.metric_rows(1, 0, {"loss": 2.5, "lr": 0.1}))
        metrics.write_metrics(session, job_id, 1, metrics.metric_rows(2, 0, {"loss": 2.0, "lr": 0.1}))
        leases.update_progress(session, job_id, {"optimizer_step": 2}, {"loss": 2.0, "lr": 0.1})
        events.add_event(session, job_id, "oom_backoff", "micro_batch_size 16 -> 8", {"micro_batch_size": 8})
    with session_factory.begin() as session:
        assert leases.finish_job(session, job_id, "w1", "succeeded")

    seen: list[tuple[str, dict[str, Any]]] = []
    while not seen or seen[-1][0] != "closed":
        seen.append(messages.get(timeout=15))
    kinds = [e for e, _ in seen]
    assert kinds[-2:] == ["end", "closed"]
    assert seen[-2][1] == {"status": "succeeded"}
    points = [(d["name"], d["step"], d["value"]) for e, d in seen if e == "metric"]
    assert sorted(points) == [("loss", 1, 2.5), ("loss", 2, 2.0), ("lr", 1, 0.1), ("lr", 2, 0.1)]
    job_events = [d["kind"] for e, d in seen if e == "job_event"]
    assert job_events[-2:] == ["oom_backoff", "succeeded"]
    assert [d["status"] for e, d in seen if e == "status"][-1] == "succeeded"
    reader.join(timeout=5)
