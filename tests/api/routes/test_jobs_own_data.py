"""Submitting jobs on your own model and data: names checked torch-free with field paths and the
served names, every local path a job reads checked against the data roots, and an init_from job
that is not yours refused exactly like one that does not exist."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from services.catalog import served_names
from services.settings import Settings


def own_spec(spec: dict[str, Any], settings: Settings, **changes: Any) -> dict[str, Any]:
    root = str(settings.home / "data" / "pets")
    return {**spec, "model": "timm:resnet18", "dataset": {"name": "imagefolder", "data_root": root}, **changes}


def only_error(response: Any) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    [error] = response.json()["errors"]
    return dict(error)


def test_own_model_and_data_are_accepted_with_no_size_yet(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any], api_settings: Settings
) -> None:
    response = client.post("/v1/jobs", json=own_spec(spec, api_settings), headers=alice)
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["spec"]["model"] == {"name": "timm:resnet18"}
    assert job["progress"]["total_optimizer_steps"] is None  # the worker counts the folder


def test_unknown_namespace_names_the_field_and_what_is_served(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any], api_settings: Settings
) -> None:
    error = only_error(client.post("/v1/jobs", json=own_spec(spec, api_settings, model="torchhub:resnet18"),
                                   headers=alice))
    assert error["loc"] == "body.model"
    assert "namespace 'torchhub' is not one of: timm, hf" in error["msg"]
    assert error["allowed"] == served_names("model")


def test_paths_outside_the_data_roots_are_refused_at_their_field(
    client: TestClient, alice: dict[str, str], admin: dict[str, str], spec: dict[str, Any],
    api_settings: Settings,
) -> None:
    bad_root = own_spec(spec, api_settings, dataset={"name": "imagefolder", "data_root": "/etc"})
    error = only_error(client.post("/v1/jobs", json=bad_root, headers=alice))
    assert error["loc"] == "body.dataset.data_root" and "outside the allowed data roots" in error["msg"]
    assert "allowed" not in error  # the roots are the servers' paths: named to admins only
    error = only_error(client.post("/v1/jobs", json=bad_root, headers=admin))
    assert error["allowed"] == [str((api_settings.home / "data").resolve())]
    weights = own_spec(spec, api_settings, model={"name": "timm:resnet18", "pretrained": True, "weights": "/etc/w.pt"})
    assert only_error(client.post("/v1/jobs", json=weights, headers=alice))["loc"] == "body.model.weights"
    saved = own_spec(spec, api_settings, model="hf:/etc/models/tiny")
    assert only_error(client.post("/v1/jobs", json=saved, headers=alice))["loc"] == "body.model.name"
    start = own_spec(spec, api_settings, init_from={"uri": "/etc/start.pt"})
    assert only_error(client.post("/v1/jobs", json=start, headers=alice))["loc"] == "body.init_from.uri"


def test_init_from_another_owners_job_reads_as_no_such_job(
    client: TestClient, alice: dict[str, str], bob: dict[str, str], spec: dict[str, Any],
    submitted: dict[str, Any],
) -> None:
    mine = client.post("/v1/jobs", json={**spec, "init_from": {"job": submitted["id"]}}, headers=alice)
    assert mine.status_code == 201, mine.text
    theirs = only_error(client.post("/v1/jobs", json={**spec, "init_from": {"job": submitted["id"]}}, headers=bob))
    missing = only_error(client.post("/v1/jobs", json={**spec, "init_from": {"job": "0" * 26}}, headers=bob))
    assert theirs["loc"] == missing["loc"] == "body.init_from.job"
    assert theirs["msg"].replace(submitted["id"], "X") == missing["msg"].replace("0" * 26, "X")
    assert "of yours" in theirs["msg"] and "alice" not in theirs["msg"]
