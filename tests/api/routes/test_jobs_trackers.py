"""Trackers at submit and in the job view: a tracker the deployment does not offer is a 422
naming the ones it does; the job's tracker runs, with their links, are in GET /v1/jobs/{id}."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.api.main import create_app
from services.jobdb.tracker_runs import mark_undelivered, open_run, set_identity
from services.settings import Settings


@pytest.fixture
def offering_mlflow(api_settings: Settings) -> FastAPI:
    settings = api_settings.model_copy(update={"trackers": ["mlflow", "tensorboard"],
                                               "mlflow_tracking_uri": "http://mlflow.internal:5000"})
    return create_app(settings, run_reaper=False)


def test_a_tracker_the_deployment_does_not_offer_is_422_with_the_offered_ones(
    offering_mlflow: FastAPI, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    with TestClient(offering_mlflow, raise_server_exceptions=False) as client:
        response = client.post("/v1/jobs", json={**spec, "trackers": ["mlflow", "wandb"]},
                               headers=alice)
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["loc"] == "body.trackers.1"
    assert error["allowed"] == ["mlflow", "tensorboard"]
    assert "'wandb' is not offered" in error["msg"]


def test_no_tracker_offered_says_so(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    response = client.post("/v1/jobs", json={**spec, "trackers": ["tensorboard"]}, headers=alice)
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["loc"] == "body.trackers.0" and error["allowed"] == []
    assert "ACCUM_TRACKERS" in error["msg"]


def test_an_unknown_tracker_is_422_with_every_tracker(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    response = client.post("/v1/jobs", json={**spec, "trackers": ["comet"]}, headers=alice)
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["loc"] == "body.trackers"
    assert error["allowed"] == ["mlflow", "tensorboard", "wandb"]


def test_register_model_needs_mlflow(
    offering_mlflow: FastAPI, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    with TestClient(offering_mlflow, raise_server_exceptions=False) as client:
        response = client.post("/v1/jobs", json={**spec, "trackers": ["tensorboard"],
                                                 "register_model": "digits-mlp"}, headers=alice)
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["loc"] == "body.register_model" and "add \"mlflow\" to trackers" in error["msg"]


def test_the_job_view_links_its_tracker_runs(
    offering_mlflow: FastAPI, session_factory: sessionmaker[Session], alice: dict[str, str],
    spec: dict[str, Any]
) -> None:
    with TestClient(offering_mlflow, raise_server_exceptions=False) as client:
        job = client.post("/v1/jobs", json={**spec, "trackers": ["tensorboard", "mlflow"]},
                          headers=alice).json()
        assert job["spec"]["trackers"] == ["tensorboard", "mlflow"]
        assert client.get(f"/v1/jobs/{job['id']}", headers=alice).json()["trackers"] == []
        url = f"http://mlflow.internal:5000/#/experiments/1/runs/r{job['id'][-6:]}"
        with session_factory.begin() as session:  # as a worker opens them
            open_run(session, job["id"], "mlflow")
            set_identity(session, job["id"], "mlflow", f"r{job['id'][-6:]}", url)
            open_run(session, job["id"], "tensorboard")
            mark_undelivered(session, job["id"], "tensorboard", "OSError: /srv/x unwritable")
        runs = client.get(f"/v1/jobs/{job['id']}", headers=alice).json()["trackers"]
        listed = client.get("/v1/jobs", headers=alice).json()
    assert runs == [
        {"tracker": "mlflow", "run_id": f"r{job['id'][-6:]}", "url": url, "delivered_step": -1,
         "pending": False},
        {"tracker": "tensorboard", "run_id": None, "url": None, "delivered_step": -1,
         "pending": True},
    ]
    assert "/srv/x" not in str(runs)  # the delivery error's text stays in the worker's log
    assert listed["items"][0]["trackers"] is None  # not in listings (one query per job)
