"""The fleet with real worker processes (SQLite + embedded broker, PostgreSQL + Redis): two
workers on different queues register themselves and `GET /v1/workers` lists them with their
queues and devices; a worker stopped cleanly is listed as stopped, one killed as lost after
the lease timeout; submits are checked against them (unknown queue, gpus above the fleet)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from worker_stack import BASE_SPEC

from services.api.main import create_app
from services.jobdb import tokens


def admin_client(stack: Any) -> tuple[TestClient, dict[str, str]]:
    with stack.sessions.begin() as session:
        _, token = tokens.create_owner_with_token(session, f"fleet-admin-{os.getpid()}", admin=True)
    client = TestClient(create_app(stack.settings, run_reaper=False), raise_server_exceptions=False)
    return client, {"Authorization": f"Bearer {token}"}


def wait_for_workers(
    client: TestClient, headers: dict[str, str], names: set[str],
    ready: Callable[[dict[str, dict[str, Any]]], bool], stack: Any, timeout: float = 240.0,
) -> dict[str, dict[str, Any]]:
    """Poll `GET /v1/workers` until ``ready(workers by name)`` holds for ``names``."""
    deadline = time.monotonic() + timeout
    listed: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        response = client.get("/v1/workers", headers=headers)
        assert response.status_code == 200, response.text
        listed = {w["name"]: w for w in response.json()["items"] if w["name"] in names}
        if set(listed) == names and ready(listed):
            return listed
        time.sleep(0.1)
    raise AssertionError(f"workers {names} not ready after {timeout}s: {listed}\n{stack.worker_logs()}")


@pytest.mark.slow
def test_two_workers_on_different_queues_register_and_leave_as_stopped_or_lost(
    stack: Any, tmp_path: Path
) -> None:
    first, second = stack.variant(tmp_path / "a"), stack.variant(tmp_path / "b")
    first.start_worker()
    second.start_worker()
    (name_a,), (name_b,) = first.hostnames, second.hostnames
    client, headers = admin_client(stack)
    try:
        with client:
            listed = wait_for_workers(
                client, headers, {name_a, name_b},
                lambda ws: all(w["state"] == "idle" for w in ws.values()), stack,
            )
            assert listed[name_a]["queues"] == [first.queue]
            assert listed[name_b]["queues"] == [second.queue]
            for worker in listed.values():
                assert worker["pid"] in {p.pid for p in first.workers + second.workers}
                assert worker["devices"] and worker["versions"]["torch"]
                assert "mlp" in worker["models"] and "digits" in worker["datasets"]

            first.workers[0].send_signal(signal.SIGTERM)  # a clean shutdown
            first.workers[0].wait(timeout=60)
            os.kill(second.workers[0].pid, signal.SIGKILL)
            second.workers[0].wait()
            # The killed one is lost once silent for the lease timeout (5 s in these stacks).
            after = wait_for_workers(
                client, headers, {name_a, name_b},
                lambda ws: ws[name_a]["state"] == "stopped" and ws[name_b]["state"] == "lost",
                stack, timeout=30,
            )
            assert after[name_b]["heartbeat_age_s"] >= stack.settings.lease_timeout_s
    finally:
        first.stop_workers()
        second.stop_workers()


def test_submits_are_checked_against_the_registered_workers(stack: Any) -> None:
    """The stack's CPU worker serves its queue: another queue is refused with the queues that
    exist, and so is a 2-GPU job; a job for its queue is taken and runs."""
    client, headers = admin_client(stack)
    names = {n for n, p in stack.hostnames.items() if p.poll() is None}
    spec = {**BASE_SPEC, "queue": stack.queue, "max_steps": 2}
    with client:
        wait_for_workers(client, headers, names,
                         lambda ws: any(w["state"] in ("idle", "busy") for w in ws.values()), stack)
        unknown = client.post("/v1/jobs", json={**spec, "queue": "nowhere"}, headers=headers)
        assert unknown.status_code == 422, unknown.text
        (error,) = unknown.json()["errors"]
        assert error["loc"] == "body.queue" and stack.queue in error["allowed"]
        too_many = client.post("/v1/jobs", json={**spec, "gpus": 2}, headers=headers)
        assert too_many.status_code == 422, too_many.text
        assert [e["loc"] for e in too_many.json()["errors"]] == ["body.gpus"]
        accepted = client.post("/v1/jobs", json=spec, headers=headers)
        assert accepted.status_code == 201, accepted.text
    job = stack.wait(accepted.json()["id"])
    assert job.status == "succeeded", (job.error, stack.worker_logs())
    assert job.worker_name in names
