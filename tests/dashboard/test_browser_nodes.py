"""The job page of a multi-node job in headless Chromium: while its gang forms it says how many
nodes joined and which workers, then lists each node's worker once the gang formed. The gang is
joined through the store as workers on two nodes would (services/jobdb/gangs.py)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from services.jobdb.gangs import Member, join_gang

from .deployment import FAKE_LEASE_S, Deployment

pytestmark = pytest.mark.browser

# On a queue no worker of the deployment serves: only the test's stand-in nodes join it.
TWO_NODES: dict[str, Any] = {
    "name": "two-nodes", "model": "mlp", "dataset": "digits", "max_steps": 20, "gpus": 0,
    "micro_batch_size": 16, "accumulation_steps": 2, "optimizer": {"name": "sgd", "lr": 0.05},
    "nodes": 2, "queue": "gangs",
}


def join(deployment: Deployment, job_id: str, node: str) -> None:
    with deployment.stack.sessions.begin() as session:
        seat = join_gang(session, job_id, Member(f"cpu@{node}", f"cpu@{node}/lease", node, "cpu"),
                         lease_timeout_s=FAKE_LEASE_S)
        assert seat is not None and seat.job_id == job_id


def test_a_multi_node_job_lists_the_worker_of_each_node(
    logged_in: Any, deployment: Deployment, shot: Any,
) -> None:
    page = logged_in
    with deployment.api() as client:
        response = client.post("/v1/jobs", json=TWO_NODES)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    join(deployment, job_id, "node-a")
    page.goto(f"/#/jobs/{job_id}")

    nodes = page.locator("#nodes")
    expect(nodes).to_contain_text("Gang forming: 1 of 2 nodes joined")
    expect(page.locator(".summary")).to_contain_text("16 × 2 × CPU × 2 nodes = 64")
    expect(page.locator("#strategy")).to_have_text("ddp (2 ranks)")  # one process on each node
    expect(nodes.locator("[data-node='0']")).to_have_text("0: cpu@node-a (node-a)")
    join(deployment, job_id, "node-b")
    page.reload()
    expect(nodes).to_contain_text("Nodes (2 of 2)")
    expect(nodes.locator("[data-node='1']")).to_have_text("1: cpu@node-b (node-b)")
    shot(page, "job-nodes")
