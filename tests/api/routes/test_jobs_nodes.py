"""Multi-node jobs through `POST /v1/jobs` and `GET /v1/jobs/{id}`: `nodes` and `min_nodes`
are validated with field paths and bounds, a queue with fewer than min_nodes workers offering
the job's ranks refuses it at submit, and the job shows the worker of each node of its
current attempt (those that joined while its gang forms)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from worker_rows import worker_row

from services.jobdb import workers as store_workers
from services.jobdb.gangs import Member, join_gang

from ..helpers import field_error, jobs_stored


@pytest.mark.parametrize(("fields", "loc", "words"), [
    ({"nodes": 0}, "body.nodes", "must be an integer from 1 to 64; got 0"),
    ({"nodes": 65}, "body.nodes", "64"),
    ({"nodes": "two"}, "body.nodes", "integer"),
    ({"nodes": 2, "min_nodes": 3}, "body.min_nodes", "min_nodes 3 is more than nodes 2"),
    ({"nodes": 2, "min_nodes": 0}, "body.min_nodes", "from 1 to 64; got 0"),
    # 48 samples: whole micro-batches of 16 on 3 nodes and on 1, not on 2.
    ({"nodes": 3, "min_nodes": 1, "accumulation_steps": 1}, "body.min_nodes", "on 2 nodes"),
])
def test_bad_nodes_are_422_at_their_field(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any], fields: dict[str, Any],
    loc: str, words: str, session_factory: sessionmaker[Session],
) -> None:
    error = field_error(client.post("/v1/jobs", json={**spec, **fields}, headers=alice), loc)
    assert words in error["msg"], error
    assert jobs_stored(session_factory) == 0


def test_min_nodes_that_cannot_keep_the_batch_lists_the_ones_that_can(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
) -> None:
    body = {**spec, "nodes": 6, "min_nodes": 1, "micro_batch_size": 1,
            "accumulation_steps": None, "effective_batch_size": 30}
    error = field_error(client.post("/v1/jobs", json=body, headers=alice), "body.min_nodes")
    # 30 samples are whole micro-batches on 1, 2, 3, 5 and 6 nodes, not on 4: from 5 up only.
    assert "on 4 nodes" in error["msg"] and error["allowed"] == [5, 6]
    ok = client.post("/v1/jobs", json={**body, "min_nodes": 5}, headers=alice)
    assert ok.status_code == 201, ok.text


def test_a_multi_node_job_needs_min_nodes_workers_offering_its_ranks(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    two_ranks = [{"kind": "cpu", "name": "cpu", "cores": 4, "ranks": 2}]
    with session_factory.begin() as session:
        store_workers.register(session, worker_row("a@n1", ["default"], devices=two_ranks))
        store_workers.register(session, worker_row("b@n2", ["default"]))
        store_workers.register(session, worker_row("c@n3", ["default"]))
    three = client.post("/v1/jobs", json={**spec, "nodes": 4}, headers=alice)
    error = field_error(three, "body.nodes")
    assert error["allowed"] == [1, 2, 3] and "it has 3 (of 3" in error["msg"]
    assert "accum worker --queues default" in error["msg"]
    error = field_error(client.post("/v1/jobs", json={**spec, "nodes": 2, "gpus": 2}, headers=alice),
                        "body.nodes")
    assert error["allowed"] == [1] and "with 2 ranks each" in error["msg"]
    fewer = client.post("/v1/jobs", json={**spec, "nodes": 4, "min_nodes": 3, "accumulation_steps": 3},
                        headers=alice)
    assert fewer.status_code == 201, fewer.text
    assert client.post("/v1/jobs", json={**spec, "nodes": 3}, headers=alice).status_code == 201


def test_the_job_shows_each_node_s_worker(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    created = client.post("/v1/jobs", json={**spec, "nodes": 2}, headers=alice)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    shown = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert (shown["spec"]["nodes"], shown["spec"]["min_nodes"], shown["nodes"]) == (2, 2, [])
    for n in (1, 2):
        with session_factory.begin() as session:
            seat = join_gang(session, job_id, Member(f"w{n}@node{n}", f"w{n}/x", f"node{n}", "cpu"),
                             lease_timeout_s=60)
            assert seat is not None
        shown = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
        assert shown["nodes"] == [{"node_rank": r, "worker": f"w{r + 1}@node{r + 1}",
                                   "host": f"node{r + 1}", "gpu": "cpu"} for r in range(n)]
    assert shown["status"] == "running" and shown["worker"]["name"] == "w1@node1"
    single = client.post("/v1/jobs", json=spec, headers=alice).json()
    assert single["nodes"] is None and "nodes" not in single["spec"]  # hashes as before
