"""A job trained to its end in-process by the worker's own runner: real checkpoints, metrics and
events for the tests that aim requests at them (auth matrix, OpenAPI fuzz)."""

from __future__ import annotations

from typing import Any

import job_specs
from fastapi.testclient import TestClient

from services.settings import Settings
from services.worker.runner import run_job

# Three optimizer steps with a checkpoint after each: a second or two of CPU.
TINY_SPEC: dict[str, Any] = {**job_specs.TINY_SPEC, "checkpoint_every": 1}


def train_job(
    client: TestClient, headers: dict[str, str], settings: Settings, spec: dict[str, Any] = TINY_SPEC
) -> tuple[str, list[int]]:
    """Submit ``spec`` through the API and run it to success; (job id, its checkpoint steps)."""
    job_id = client.post("/v1/jobs", json=spec, headers=headers).json()["id"]
    assert run_job(settings, job_id, "test-runner") == "succeeded"
    listed = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=headers).json()["items"]
    steps = [c["step"] for c in listed]
    assert steps, "the trained job wrote no checkpoint"
    return job_id, steps
