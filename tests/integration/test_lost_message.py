"""Impossible to lose work: a job whose broker message never arrived still runs.

The API could not reach the broker when the job was submitted (it answers 201 and leaves the
job queued with no message); the workers' reapers send the message once the job has waited
ACCUM_REQUEUE_AFTER_S, and the job runs without anyone resubmitting it.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient

from services.api.main import create_app
from services.jobdb import tokens
from services.ports import free_port

SPEC: dict[str, Any] = {
    "model": "mlp",
    "dataset": "digits",
    "micro_batch_size": 16,
    "accumulation_steps": 2,
    "max_steps": 4,
    "optimizer": {"name": "sgd", "lr": 0.05},
    "gpus": 0,
}


def unreachable_broker_url() -> str:
    """A Redis URL on a local port where nothing listens (bound, then closed)."""
    return f"redis://127.0.0.1:{free_port()}/0"


def test_job_submitted_while_the_broker_is_down_runs_without_resubmitting(stack: Any) -> None:
    broker_down = stack.settings.model_copy(update={"broker_url": unreachable_broker_url()})
    with stack.sessions.begin() as session:
        _, token = tokens.create_owner_with_token(session, f"lost-{uuid.uuid4().hex[:8]}")
    with TestClient(create_app(broker_down, run_reaper=False)) as client:
        response = client.post(
            "/v1/jobs",
            json={**SPEC, "queue": stack.queue},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    assert stack.job(job_id).status == "queued"  # no message reached any worker

    job = stack.wait(job_id, timeout=60 + stack.settings.requeue_after_s)
    assert job.status == "succeeded", job.error
    assert job.attempts == 1
    assert stack.event_kinds(job_id).count("started") == 1
