"""The memory levers through the API: adamw8bit refused for a CPU job with the reason at
body.optimizer.name, a bad activation_checkpointing at its field, and the job view saying
which levers a job has on."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient


def test_adamw8bit_for_a_cpu_job_is_422_at_optimizer_name(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    body = {**spec, "gpus": 0, "optimizer": {"name": "adamw8bit", "lr": 1e-3}}
    response = client.post("/v1/jobs", json=body, headers=alice)
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert (error["loc"], error["allowed"]) == ("body.optimizer.name", ["sgd", "adamw"])
    assert "CUDA GPUs only" in error["msg"]


def test_a_bad_checkpointing_value_is_422_with_the_allowed_ones(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    response = client.post("/v1/jobs", json={**spec, "activation_checkpointing": "on"}, headers=alice)
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["loc"] == "body.activation_checkpointing" and error["allowed"] == [True, False, {"every": 2}]


def test_the_job_view_lists_the_levers_on(client: TestClient, alice: dict[str, str], spec: dict[str, Any]) -> None:
    body = {**spec, "model": {"name": "hf:gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2}, "dataset": "text",
            "activation_checkpointing": {"every": 2}, "peft": {"method": "lora", "r": 4, "merge": True}}
    created = client.post("/v1/jobs", json=body, headers=alice)
    assert created.status_code == 201, created.text
    job = client.get(f"/v1/jobs/{created.json()['id']}", headers=alice).json()
    assert job["levers"] == ["activation_checkpointing (every 2)", "lora (r 4, alpha 16, merge)"]
    plain = client.post("/v1/jobs", json=spec, headers=alice).json()
    assert client.get(f"/v1/jobs/{plain['id']}", headers=alice).json()["levers"] == []
