"""A ``strategy: fsdp`` job on two nodes with no shared disk (each a real worker with
``--cpu-ranks 2``, its own ACCUM_HOME and cache; checkpoints on S3, moto in server mode):
``kill -9`` the worker holding it mid-run, and the other takes it over from the store (every
rank's stored shards fetched into its cache and loaded into its own ranks' shards) and finishes it with the weights
of an uninterrupted run to float32 round-off, every step's loss once. The API's download (GET /v1/jobs/{id}/checkpoints/{step}) of
its last checkpoint is one file (the consolidated file the worker stored beside the shards) that ``torch.load`` + ``load_state_dict`` read into the plain
model.

The job is 30 steps (was 600): held after step 8, both ranks waiting at a test-only gate
(tests/held_jobs.py) with the checkpoint of step 5 listed, until its worker is killed; then the
other worker trains the 22 steps left. The kill lands mid-job by construction, not by length;
the assertions are as before.

    .venv/bin/python -m pytest tests/reliability/test_fsdp_node_loss.py -x -q
"""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from held_jobs import Hold, plugin_on_path
from worker_stack import make_stack

from services.catalog.build import build_model
from services.spec import parse_spec
from services.worker.build import build_data

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# Held after step 8 (each rank loads N = 2 micro-batches a step; an epoch is 11 windows and a
# bit, so no uneven last window before the hold), past the checkpoint at 5.
HOLD_STEP, HELD_CHECKPOINT = 8, 5
SPEC: dict[str, Any] = {"max_steps": 30, "checkpoint_every": 5, "keep_checkpoints": 2, "micro_batch_size": 32,
        "accumulation_steps": 2, "max_restarts": 4, "gpus": 2, "strategy": "fsdp",
        "dataset": Hold.dataset(HOLD_STEP, micro_batches=2)}
LEASES = {"lease_timeout_s": 3.0, "heartbeat_interval_s": 0.5, "reaper_interval_s": 0.2}
ROUND_OFF = 1e-5


def test_an_fsdp_job_survives_the_loss_of_its_node(
    tmp_path: Path, s3_url: str, request: pytest.FixtureRequest
) -> None:
    # PostgreSQL + Redis only (no worker of the session stack: two of its own, 4 rank processes
    # a run); the SQLite deployment's takeover is test_two_nodes.py's.
    (tmp_path / "stack").mkdir()
    own = make_stack("postgres_redis", tmp_path / "stack", request).variant(tmp_path, artifacts_url=s3_url, **LEASES)
    hold = Hold(tmp_path / "gate")
    homes = [tmp_path / f"node{i}" for i in (1, 2)]
    for home in homes:
        own.start_worker(args=("--cpu-ranks", "2"), ACCUM_HOME=str(home), ACCUM_CACHE_DIR=str(home / "cache"),
                         **hold.env())
    try:
        with plugin_on_path():
            reference_id = own.create(**SPEC)
        assert own.wait(reference_id, timeout=300).status == "succeeded", own.worker_logs()
        job_id = hold.create(own, **SPEC)
        hold.wait_held(own, job_id, processes=2, step=HOLD_STEP, checkpoint=HELD_CHECKPOINT)
        victim = own.process_holding(job_id)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        hold.release()
        job = own.wait(job_id, timeout=300)
        assert job.status == "succeeded", (job.error, own.worker_logs())
        assert job.restarts == 1 and job.attempts == 2
        final, reference = own.final_weights(job_id), own.final_weights(reference_id)
        assert final.keys() == reference.keys()
        assert max(float((final[k] - reference[k]).abs().max()) for k in final) <= ROUND_OFF
        assert [step for step, _ in own.metric_steps(job_id)] == list(range(1, SPEC["max_steps"] + 1))
        assert own.checkpoint_problems(job_id) == []

        _, response, shown = own.served_by_an_api(job_id, tmp_path / "api")
        assert response.status_code == 200, response.text
        assert shown["strategy"] == "fsdp"
    finally:
        hold.release()
        own.stop_workers()
    spec = parse_spec({"model": "mlp", "dataset": "digits", "micro_batch_size": 8, "accumulation_steps": 1, "max_steps": 1,
                       "optimizer": {"name": "sgd", "lr": 0.1}})
    plain = build_model(spec.model.name, build_data(spec, None), **spec.model.options)
    plain.load_state_dict(torch.load(io.BytesIO(response.content), weights_only=True)["model"])
    assert all(torch.equal(plain.state_dict()[k], final[k]) for k in final)
