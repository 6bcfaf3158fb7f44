"""`POST /v1/jobs` against the registered fleet: a queue no worker has served within
ACCUM_QUEUE_GRACE_S is a 422 naming the queues that exist (ACCUM_ALLOW_EMPTY_QUEUES lets it
through), more ranks than any worker of the queue offers (GPUs, or the CPU ranks of
``--cpu-ranks``) is a 422, and so are a model or dataset
its workers do not advertise; with no worker registered at all nothing is checked."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from worker_rows import worker_row

from services.jobdb import workers as store_workers
from services.jobdb.types import utcnow

from ..helpers import field_error, jobs_stored


@pytest.fixture
def fleet(session_factory: sessionmaker[Session]) -> None:
    """A CPU worker on `default`, a 4-GPU one on `a100` (also serving `default`) that offers
    no `text` dataset, and a k80 worker last seen two days ago."""
    now = utcnow()
    with session_factory.begin() as session:
        store_workers.register(session, worker_row("cpu@n1", ["default"]), now=now)
        store_workers.register(session, worker_row("gpu@n2", ["a100", "default"], gpus=4,
                                                   models=["mlp", "resnet18"]), now=now)
        store_workers.register(session, worker_row("old@n3", ["k80"], gpus=1),
                               now=now - timedelta(days=2))


def test_no_registered_worker_means_no_fleet_check(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    response = client.post("/v1/jobs", json={**spec, "queue": "nowhere", "gpus": 8}, headers=alice)
    assert response.status_code == 201, response.text


@pytest.mark.usefixtures("fleet")
def test_an_unknown_queue_is_refused_naming_the_queues_that_exist(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    for queue in ("nowhere", "k80"):  # k80's only worker was last seen two days ago
        response = client.post("/v1/jobs", json={**spec, "queue": queue}, headers=alice)
        error = field_error(response, "body.queue")
        assert error["allowed"] == ["a100", "default"]
        assert f"accum worker --queues {queue}" in error["msg"]
        assert "ACCUM_ALLOW_EMPTY_QUEUES" in error["msg"]
    assert jobs_stored(session_factory) == 0
    ok = client.post("/v1/jobs", json={**spec, "queue": "a100"}, headers=alice)
    assert ok.status_code == 201, ok.text


@pytest.mark.usefixtures("fleet")
def test_gpus_above_the_most_a_worker_of_the_queue_has_are_refused(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
) -> None:
    error = field_error(client.post("/v1/jobs", json={**spec, "gpus": 5}, headers=alice), "body.gpus")
    assert error["allowed"] == [0, 1, 2, 3, 4] and "at most 4 ranks" in error["msg"]
    assert client.post("/v1/jobs", json={**spec, "gpus": 4}, headers=alice).status_code == 201


def test_a_cpu_only_queue_takes_one_gpu_jobs_on_its_cpu_but_no_ddp(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        store_workers.register(session, worker_row("cpu@n1", ["default"]))
    assert client.post("/v1/jobs", json={**spec, "gpus": 1}, headers=alice).status_code == 201
    error = field_error(client.post("/v1/jobs", json={**spec, "gpus": 2}, headers=alice), "body.gpus")
    assert error["allowed"] == [0, 1] and "at most 0 ranks" in error["msg"]
    assert "--cpu-ranks" in error["msg"]  # how a CPU node offers more


def test_ranks_refused_count_the_live_workers_and_say_what_to_do(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    """Workers of earlier `accum up` runs, stopped, are not counted as the queue's workers."""
    with session_factory.begin() as session:
        for name in ("cpu@old1", "cpu@old2", "cpu@now"):
            store_workers.register(session, worker_row(name, ["default"]))
        for name in ("cpu@old1", "cpu@old2"):
            store_workers.mark_stopped(session, name)
    error = field_error(client.post("/v1/jobs", json={**spec, "gpus": 2}, headers=alice), "body.gpus")
    assert error["msg"] == (
        "gpus 2 needs a worker with 2 ranks (GPUs, or CPU ranks); queue 'default' has 1 live "
        "worker, with at most 0 ranks (one process a job), 2 stopped not counted. Ask for gpus 1 "
        "or less, or start a worker with 2 GPUs or `--cpu-ranks 2` (`accum worker` or `accum up`)")


def test_a_cpu_worker_registered_with_cpu_ranks_takes_ddp_jobs_up_to_them(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    cpu = {"kind": "cpu", "name": "cpu", "cores": 4, "ranks": 3}  # accum worker --cpu-ranks 3
    with session_factory.begin() as session:
        store_workers.register(session, worker_row("cpu@n1", ["default"], devices=[cpu]))
    assert client.post("/v1/jobs", json={**spec, "gpus": 3}, headers=alice).status_code == 201
    error = field_error(client.post("/v1/jobs", json={**spec, "gpus": 4}, headers=alice), "body.gpus")
    assert error["allowed"] == [0, 1, 2, 3] and "at most 3 ranks" in error["msg"]


@pytest.mark.usefixtures("fleet")
def test_a_model_or_dataset_no_worker_of_the_queue_offers_is_refused(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
) -> None:
    cnn = {**spec, "queue": "a100", "model": "small_cnn", "dataset": "fake"}
    response = client.post("/v1/jobs", json=cnn, headers=alice)
    model, dataset = field_error(response, "body.model"), field_error(response, "body.dataset")
    assert model["allowed"] == ["mlp", "resnet18"] and dataset["allowed"] == ["digits"]
    assert "small_cnn" in model["msg"] and "a100" in model["msg"]


@pytest.mark.usefixtures("fleet")
def test_allow_empty_queues_lets_an_autoscaled_fleet_take_jobs_for_any_queue(
    app: FastAPI, alice: dict[str, str], spec: dict[str, Any],
) -> None:
    app.state.settings = app.state.settings.model_copy(update={"allow_empty_queues": True})
    with TestClient(app) as client:
        response = client.post("/v1/jobs", json={**spec, "queue": "autoscaled"}, headers=alice)
    assert response.status_code == 201, response.text
