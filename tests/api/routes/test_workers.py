"""`GET /v1/workers`: owners see each worker's name, queues, devices and state; admins every
field (host, versions, what it builds, its current job, heartbeat age); a worker silent for
the lease timeout is lost; `/metrics` has workers per queue and state and heartbeat ages."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from worker_rows import worker_row as row

from services.jobdb import workers as store_workers
from services.jobdb.types import utcnow

from .test_monitoring import samples


def test_owners_see_name_queues_devices_state_and_admins_every_field(
    client: TestClient, alice: dict[str, str], admin: dict[str, str],
    session_factory: sessionmaker[Session], submitted: dict[str, Any],
) -> None:
    with session_factory.begin() as session:
        store_workers.register(session, row("gpu0@node1", ["a100"], gpus=1))
        store_workers.register(session, row("cpu@node2", ["default"]),
                               now=utcnow() - timedelta(hours=1))
    as_owner = client.get("/v1/workers", headers=alice)
    assert as_owner.status_code == 200, as_owner.text
    items = as_owner.json()["items"]
    assert [w["name"] for w in items] == ["cpu@node2", "gpu0@node1"]
    assert all(set(w) == {"name", "queues", "devices", "state"} for w in items)
    assert [w["state"] for w in items] == ["lost", "idle"]
    assert items[1]["devices"][0]["kind"] == "gpu" and items[1]["queues"] == ["a100"]

    by_name = {w["name"]: w for w in client.get("/v1/workers", headers=admin).json()["items"]}
    gpu = by_name["gpu0@node1"]
    assert gpu["host"] == "node1" and gpu["gpus"] == 1 and gpu["versions"] == {"torch": "2.14.1"}
    assert gpu["models"] == ["mlp"] and gpu["current_job"] is None
    assert 0 <= gpu["heartbeat_age_s"] < by_name["cpu@node2"]["heartbeat_age_s"]
    assert client.get("/v1/workers").status_code == 401


def test_prometheus_counts_workers_per_queue_and_state_with_heartbeat_ages(
    client: TestClient, session_factory: sessionmaker[Session]
) -> None:
    with session_factory.begin() as session:
        store_workers.register(session, row("a@n", ["a100", "default"]))
        store_workers.register(session, row("b@n", ["a100"]))
        store_workers.register(session, row("c@n", ["a100"]), now=utcnow() - timedelta(hours=1))
        store_workers.register(session, row("d@n", ["a100"]))
        store_workers.mark_stopped(session, "d@n")
    values = samples(client.get("/metrics").text)
    assert values[("accum_workers", (("queue", "a100"), ("state", "idle")))] == 2
    assert values[("accum_workers", (("queue", "default"), ("state", "idle")))] == 1
    assert values[("accum_workers", (("queue", "a100"), ("state", "lost")))] == 1
    assert values[("accum_workers", (("queue", "a100"), ("state", "stopped")))] == 1
    ages = {dict(labels)["worker"]: v for (name, labels), v in values.items()
            if name == "accum_worker_heartbeat_age_seconds"}
    assert set(ages) == {"a@n", "b@n", "c@n"} and ages["c@n"] > ages["a@n"]
