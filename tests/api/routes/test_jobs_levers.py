"""The memory levers through the API: adamw8bit refused for a CPU job with the reason at
body.optimizer.name, a bad activation_checkpointing at its field, the job view saying
which levers a job has on, and a LoRA job's merged model served as a tar."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from services.artifacts import merged_key, open_store
from services.settings import Settings


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


def test_the_merged_model_is_served_as_a_tar_once_stored(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any], api_settings: Settings, tmp_path: Path,
) -> None:
    """GET /v1/jobs/ID/merged: 404 saying why until the worker stored it (services.worker.levers
    .store_merged, tested with a real model in tests/worker/test_levers.py), then the tar."""
    job = client.post("/v1/jobs", json=spec, headers=alice).json()
    missing = client.get(f"/v1/jobs/{job['id']}/merged", headers=alice)
    assert missing.status_code == 404 and "no peft.merge" in missing.json()["detail"]
    folder = tmp_path / "merged"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    packed = tmp_path / "merged.tar"
    with tarfile.open(packed, "w") as tar:
        tar.add(folder, arcname="merged")
    open_store(api_settings.artifacts_url).put(merged_key(job["id"]), packed)
    served = client.get(f"/v1/jobs/{job['id']}/merged", headers=alice)
    assert served.status_code == 200 and served.content == packed.read_bytes()
    assert served.headers["content-type"] == "application/x-tar"


def test_lora_under_fsdp_is_taken_with_its_merge(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    """LoRA on sharded ranks trains exactly, and its merged model is gathered from the shards
    at the job's end (tests/worker/test_levers_fsdp.py): taken with merge too."""
    body = {**spec, "model": {"name": "hf:gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2}, "dataset": "text",
            "gpus": 2, "strategy": "fsdp", "peft": {"method": "lora", "r": 4}}
    created = client.post("/v1/jobs", json=body, headers=alice)
    assert created.status_code == 201, created.text
    merged = client.post("/v1/jobs", json={**body, "peft": {"method": "lora", "r": 4, "merge": True}}, headers=alice)
    assert merged.status_code == 201, merged.text
    assert merged.json()["spec"]["peft"]["merge"] is True
