"""``strategy: fsdp`` with ``nodes: 2``: two real worker processes as two nodes (each its own
ACCUM_HOME and cache, no shared disk; checkpoints on S3, moto in server mode; PostgreSQL +
Redis), one gloo CPU rank per node, so the model is sharded across the nodes.

- The job succeeds with the final weights of the same job on one process with ``N x world``
  (the world-invariant order) to float32 round-off. Each rank stored its own shards from its
  own disk (``<job>/<step>/__<rank>_0.distcp``; the row written once both were stored, its
  size every object's); the API's download of the last checkpoint is one consolidated file
  that ``torch.load`` reads into the plain model.
- Node 1's worker SIGKILLed mid-job with ``min_nodes: 1``: the job resumes on the survivor
  alone, a world of 1 loading the 2-rank shards from S3 (DCP reshards them), and ends with the
  uninterrupted run's weights, every loss step once. The job is 30 steps (was 600): held after
  step 12, both ranks waiting at a test-only gate (tests/held_jobs.py) with the 2-rank
  checkpoint of step 10 listed, until the node is killed; then it trains the 18 steps left on
  the survivor. The kill lands mid-job by construction, not by length; the assertions are as
  before.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from held_jobs import Hold, plugin_on_path
from worker_stack import Stack

from services.artifacts import open_store
from services.jobdb import checkpoints
from services.jobdb.gangs import members_of

from .gang_nodes import (
    HELD_DATASET,
    ROUND_OFF,
    kill_held_node,
    largest_difference,
    single_process_reference,
    two_nodes,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.parametrize("stack", ["postgres_redis"], indirect=True)]

STEPS = 30
SPEC: dict[str, Any] = {"micro_batch_size": 16, "max_steps": STEPS, "checkpoint_every": 5,
                        "keep_checkpoints": 2, "max_restarts": 3}
FSDP: dict[str, Any] = {**SPEC, "strategy": "fsdp", "gpus": 1, "nodes": 2, "accumulation_steps": 2}
# The node-loss job: held after step 12 (past the checkpoint at 10) until its node is killed.
LOSS_SPEC: dict[str, Any] = {**SPEC, "dataset": HELD_DATASET}


def test_an_fsdp_job_shards_over_two_nodes_each_storing_its_own_shards(
    stack: Stack, tmp_path: Path, s3_url: str
) -> None:
    own = two_nodes(stack, tmp_path, s3_url)
    try:
        reference = single_process_reference(own, SPEC)
        job_id = own.create(**FSDP)
        job = own.wait(job_id, timeout=300)
        assert job.status == "succeeded", (job.error, own.worker_logs())
        with own.sessions() as session:
            members = members_of(session, job_id, job.attempts)
            kept = checkpoints.list_checkpoints(session, job_id)
        assert [m.node_rank for m in members] == [0, 1] and len({m.worker for m in members}) == 2
        assert [c.step for c in kept] == [STEPS - 5, STEPS]
        store = open_store(own.settings.artifacts_url)
        for row in kept:
            names = sorted(o.key.rsplit("/", 1)[1] for o in store.list(f"{job_id}/{row.step}/"))
            assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "consolidated.pt",
                             "manifest.json", "trainer.pt"], names
        assert own.checkpoint_problems(job_id) == []  # every shard as listed; sizes; no orphans
        weights = own.final_weights(job_id)  # the consolidated file of the last checkpoint
        difference = largest_difference(weights, reference)
        assert difference <= ROUND_OFF, difference
        assert [s for s, _ in own.metric_steps(job_id)] == list(range(1, STEPS + 1))
        latest, response, shown = own.served_by_an_api(job_id, tmp_path / "api")
        assert response.status_code == 200, response.text
        assert shown["strategy"] == "fsdp"
    finally:
        own.stop_workers()
    downloaded = torch.load(io.BytesIO(response.content), weights_only=True)["model"]
    assert all(torch.equal(downloaded[k], weights[k]) for k in weights)


def test_an_fsdp_job_resumes_on_the_surviving_node_from_the_two_ranks_shards(
    stack: Stack, tmp_path: Path, s3_url: str
) -> None:
    hold = Hold(tmp_path / "gate")
    own = two_nodes(stack, tmp_path, s3_url, **hold.env())
    try:
        with plugin_on_path():
            reference = single_process_reference(own, LOSS_SPEC)
        job_id = hold.create(own, **{**FSDP, **LOSS_SPEC}, min_nodes=1)
        kill_held_node(own, hold, job_id, node_rank=1)
        job = own.wait(job_id, timeout=300)
        assert job.status == "succeeded", (job.error, own.worker_logs())
        kinds = own.event_kinds(job_id)
        assert "node_lost" in kinds and "world_changed" in kinds, kinds
        with own.sessions() as session:
            assert len(members_of(session, job_id, job.attempts)) == 1  # the survivor alone
        assert [s for s, _ in own.metric_steps(job_id)] == list(range(1, STEPS + 1))  # each once
        difference = largest_difference(own.final_weights(job_id), reference)
        assert difference <= ROUND_OFF, difference
        assert own.checkpoint_problems(job_id) == []
    finally:
        hold.release()
        own.stop_workers()
