"""Jobs logged to MLflow, TensorBoard and W&B through real worker processes and the trackers'
real clients: an MLflow tracking server started here (SQLite backend) read back through
``MlflowClient``, TensorBoard event files read back with tensorboard's ``EventAccumulator``,
W&B offline run files parsed back. Each tracker must hold every step of accum's own metrics,
once, also after a SIGKILLed attempt, and an MLflow server down for the whole job gets the
points once it is back."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_stack import Stack

from bench.harness.mlflow_server import MlflowServer
from services.api.job_view import job_view
from services.jobdb import checkpoints, jobs, metrics
from services.jobdb.sessions import session_factory
from services.jobdb.tracker_runs import runs_of
from services.ports import free_port
from services.worker.trackers.wandb_files import history
from services.worker.trackers.wandb_tracker import run_files

ALL = ["mlflow", "tensorboard", "wandb"]
# Values that are the same in every attempt (resume is exact); the timings are not.
DETERMINISTIC = ("loss", "lr", "grad_norm", "val_loss", "val_accuracy", "exactness_rel_error")


def tracker_env(stack: Stack, mlflow_uri: str, end_wait_s: float = 120) -> dict[str, str]:
    wandb_dir = stack.settings.home / "wandb"
    return {
        "ACCUM_TRACKERS": json.dumps(ALL), "ACCUM_MLFLOW_TRACKING_URI": mlflow_uri,
        "ACCUM_WANDB_MODE": "offline", "ACCUM_WANDB_DIR": str(wandb_dir),
        "ACCUM_TRACKER_FLUSH_EVERY_S": "0.3", "ACCUM_TRACKER_END_WAIT_S": str(end_wait_s),
        # Never the internet: W&B offline, silent, nothing of the machine or the code sent.
        "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true", "WANDB_ERROR_REPORTING": "false",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    }


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One server for the module (it takes ~20-60 s to start on a busy machine): each job is
    its own run, found by its job id."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def trackers(stack: Stack, tmp_path: Path) -> Iterator[Stack]:
    """The test's deployment on a queue of its own; its workers (started with the trackers'
    settings) are stopped after the test."""
    variant = stack.variant(tmp_path)
    try:
        yield variant
    finally:
        variant.stop_workers()


def accum_points(stack: Stack, job_id: str) -> dict[str, list[tuple[int, float]]]:
    """accum's own metrics API's points: name -> (step, value), by step."""
    with stack.sessions() as session:
        rows, _ = metrics.read_metrics(session, job_id, limit=1_000_000)
    points: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        if row.value is not None:
            points.setdefault(row.name, []).append((row.step, row.value))
    return points


def mlflow_run(uri: str, job_id: str) -> Any:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("accum")
    runs = client.search_runs([experiment.experiment_id], f"tags.`accum.job_id` = '{job_id}'")
    assert len(runs) == 1, f"one MLflow run per job, got {len(runs)}"
    return client, runs[0]


def mlflow_points(client: Any, run_id: str, names: list[str]) -> dict[str, list[tuple[int, float]]]:
    return {name: sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))
            for name in names}


def tensorboard_points(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_points(wandb_dir: Path, job_id: str) -> dict[str, list[tuple[int, float]]]:
    points: dict[str, list[tuple[int, float]]] = {}
    for path in run_files(wandb_dir, job_id):
        for step, values in history(path):
            for name, value in values.items():
                points.setdefault(name, []).append((step, value))
    return points


def same_steps_and_values(got: dict[str, list[tuple[int, float]]],
                          want: dict[str, list[tuple[int, float]]], rel: float = 0.0) -> None:
    assert sorted(got) == sorted(want)
    for name, points in want.items():
        assert [s for s, _ in got[name]] == [s for s, _ in points], name  # each step once
        if name in DETERMINISTIC:
            assert [v for _, v in got[name]] == pytest.approx([v for _, v in points], rel=rel), name


def wait_until(check: Any, what: str, stack: Stack, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout} s\n{stack.worker_logs()}")


def delivered(stack: Stack, job_id: str) -> dict[str, tuple[int, str | None]]:
    with stack.sessions() as session:
        return {r.tracker: (r.delivered_step, r.undelivered) for r in runs_of(session, job_id)}


def test_a_job_reaches_mlflow_tensorboard_and_wandb(
    trackers: Stack, mlflow_server: MlflowServer
) -> None:
    trackers.start_worker(**tracker_env(trackers, mlflow_server.uri))
    job_id = trackers.create(trackers=ALL, eval_every=4, name="digits-tracked")
    job = trackers.wait(job_id, timeout=180)
    assert job.status == "succeeded", (job.error, trackers.worker_logs())
    want = accum_points(trackers, job_id)
    assert {"loss", "lr", "val_loss", "exactness_rel_error"} <= set(want)
    # The end of the job waits (briefly) for the trackers: everything is there already.
    assert delivered(trackers, job_id) == {name: (12, None) for name in ALL}

    client, run = mlflow_run(mlflow_server.uri, job_id)
    assert run.info.run_name == "digits-tracked" and run.info.status == "FINISHED"
    assert run.data.tags["accum.owner"] == trackers.owner.name
    assert run.data.tags["accum.queue"] == trackers.queue
    assert run.data.tags["accum.exactness"] == "exact"
    assert run.data.tags["accum.checkpoint"] == f"{trackers.settings.artifacts_url}/{job_id}/12.pt"
    assert run.data.params["optimizer.lr"] == "0.05" and run.data.params["max_steps"] == "12"
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")] == ["checkpoint/12.pt"]
    same_steps_and_values(mlflow_points(client, run.info.run_id, list(want)), want)

    logdir = trackers.settings.artifacts_path / "tensorboard" / job_id
    same_steps_and_values(tensorboard_points(logdir), want, rel=1e-6)  # float32 in event files

    offline = wandb_points(trackers.settings.home / "wandb" / job_id, job_id)
    same_steps_and_values(offline, want)

    with trackers.sessions() as session:  # what GET /v1/jobs/{id} and the dashboard show
        view = job_view(session, jobs.load_job(session, job_id), trackers.owner.name)
    links = {run.tracker: run for run in view.trackers or []}
    assert links["mlflow"].url == (f"{mlflow_server.uri}/#/experiments/"
                                   f"{run.info.experiment_id}/runs/{run.info.run_id}")
    assert links["tensorboard"].run_id == job_id and links["wandb"].run_id == job_id


def test_a_sigkilled_attempt_continues_the_same_runs_with_each_step_once(
    trackers: Stack, mlflow_server: MlflowServer
) -> None:
    env = tracker_env(trackers, mlflow_server.uri)
    trackers.start_worker(**env)
    trackers.start_worker(**env)
    # Long enough that the kill falls mid-job: the trackers deliver from a host process that
    # starts (imports its clients, opens the runs: ~10 s on a loaded machine) as the training
    # does, and no longer slows the training down; steps of this wider MLP take 10-50 ms here
    # (4000 steps of the small one could end first).
    spec = {"max_steps": 1500, "checkpoint_every": 50, "micro_batch_size": 32, "eval_every": 100,
            "model": {"name": "mlp", "hidden": 1024, "depth": 3}}
    job_id = trackers.create(trackers=ALL, **spec)

    def past_a_checkpoint_and_delivered() -> bool:
        with trackers.sessions() as session:
            kept = checkpoints.list_checkpoints(session, job_id)
        sent = delivered(trackers, job_id)
        return bool(kept) and all(sent.get(name, (-1, None))[0] >= 10 for name in ALL)

    # Long enough for two workers to start on a loaded machine (importing torch).
    wait_until(past_a_checkpoint_and_delivered, "points delivered past a checkpoint", trackers,
               timeout=300)
    victim = trackers.process_holding(job_id)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert trackers.job(job_id).progress["optimizer_step"] < spec["max_steps"], "make the job longer"

    job = trackers.wait(job_id, timeout=240)
    assert job.status == "succeeded", (job.error, trackers.worker_logs())
    assert job.attempts == 2 and job.resume_step is not None
    want = accum_points(trackers, job_id)
    client, run = mlflow_run(mlflow_server.uri, job_id)  # one run for both attempts
    assert run.info.status == "FINISHED"
    same_steps_and_values(mlflow_points(client, run.info.run_id, list(want)), want)
    logdir = trackers.settings.artifacts_path / "tensorboard" / job_id
    assert len(list(logdir.iterdir())) == 2  # one event file per attempt
    same_steps_and_values(tensorboard_points(logdir), want, rel=1e-6)
    wandb_dir = trackers.settings.home / "wandb" / job_id
    assert len(run_files(wandb_dir, job_id)) == 2  # `wandb sync` uploads both to run job_id
    same_steps_and_values(wandb_points(wandb_dir, job_id), want)


@pytest.mark.parametrize("buffer_max_steps", [None, 10], ids=["buffered", "past-the-buffer"])
def test_an_mlflow_server_down_for_the_whole_job_gets_the_points_when_back(
    trackers: Stack, tmp_path: Path, mlflow_server: MlflowServer, buffer_max_steps: int | None
) -> None:
    """With a buffer of 10 steps the job's 13 (0 to 12) do not fit: the oldest are let go and
    read back from accum's metrics store once MLflow is back, every step still once."""
    server = MlflowServer(tmp_path / "mlflow", free_port())  # not started yet
    # Its database a copy of the running server's, already migrated: it starts sooner.
    server.root.mkdir()
    with sqlite3.connect(mlflow_server.root / "mlflow.db") as source, \
            sqlite3.connect(server.root / "mlflow.db") as copy:
        source.backup(copy)
    bound = {} if buffer_max_steps is None else {"ACCUM_TRACKER_BUFFER_MAX_STEPS": str(buffer_max_steps)}
    trackers.start_worker(**tracker_env(trackers, server.uri, end_wait_s=1), **bound)
    job_id = trackers.create(trackers=["mlflow"])
    job = trackers.wait(job_id, timeout=180)
    assert job.status == "succeeded", (job.error, trackers.worker_logs())
    # Reported by the sink's thread, which may find the server down after the job's end.
    wait_until(lambda: "tracker_undelivered" in trackers.event_kinds(job_id),
               "the tracker_undelivered event", trackers)
    assert delivered(trackers, job_id)["mlflow"][0] == -1
    try:
        server.start()
        wait_until(lambda: delivered(trackers, job_id)["mlflow"] == (12, None),
                   "the points delivered once MLflow is back", trackers)
        # The sink records the delivery, then ends the run: wait for the end too.
        client, run = wait_until(
            lambda: (found := mlflow_run(server.uri, job_id))[1].info.status == "FINISHED" and found,
            "the MLflow run ended once MLflow is back", trackers)
        want = accum_points(trackers, job_id)
        same_steps_and_values(mlflow_points(client, run.info.run_id, list(want)), want)
        assert run.data.tags["accum.exactness"] == "exact"
        assert "tracker_delivered" in trackers.event_kinds(job_id)
    finally:
        server.stop()


def test_a_two_rank_job_is_logged_once_by_rank_0(
    settings: Any, make_job: Any
) -> None:
    from services.worker.runner import run_job

    tracked = settings.model_copy(update={"trackers": ["tensorboard"], "tracker_flush_every_s": 0.2})
    job_id = make_job({"model": "mlp", "dataset": "digits", "micro_batch_size": 64,
                       "accumulation_steps": 2, "max_steps": 6, "gpus": 2,
                       "optimizer": {"name": "sgd", "lr": 0.1}, "trackers": ["tensorboard"]})
    assert run_job(tracked, job_id, "ddp-worker") == "succeeded"
    with session_factory(tracked)() as session:
        rows, _ = metrics.read_metrics(session, job_id, name="loss")
        [run] = runs_of(session, job_id)
    assert (run.tracker, run.delivered_step) == ("tensorboard", 6)
    logged = tensorboard_points(tracked.artifacts_path / "tensorboard" / job_id)
    assert [step for step, _ in logged["loss"]] == [r.step for r in rows] == list(range(1, 7))
    assert [v for _, v in logged["loss"]] == pytest.approx([r.value for r in rows], rel=1e-6)


def test_a_flush_of_1000_values_and_a_tag_reaches_mlflow_in_calls_within_its_limit(
    mlflow_server: MlflowServer,
) -> None:
    """The server counts metrics, params and tags of a log-batch call together (at most 1000):
    a flush of 1000 values with a tag was refused, and the sink retried it forever (a fast job
    fills a flush with that many)."""
    from mlflow.tracking import MlflowClient

    from services.worker.trackers.base import RunIdentity, StepPoints
    from services.worker.trackers.mlflow_tracker import MAX_METRICS, MlflowTracker, batches_of

    assert [len(b) for b in batches_of(["m"] * MAX_METRICS, 1)] == [MAX_METRICS - 1, 1]
    assert [len(b) for b in batches_of([], 2)] == []
    tracker = MlflowTracker(mlflow_server.uri, "batches", None)
    run_id, _, held = tracker.open(RunIdentity(job_id="batches-job", name="batches", owner="o",
                                               queue="q", params={}))
    assert held == -1
    steps = range(1, MAX_METRICS // 2 + 1)
    tracker.send([StepPoints(s, {"loss": 1.0 / s, "lr": 0.1}) for s in steps], {"accum.exactness": "exact"})
    client = MlflowClient(mlflow_server.uri)
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == list(steps)
    assert sorted(m.step for m in client.get_metric_history(run_id, "lr")) == list(steps)
    assert client.get_run(run_id).data.tags["accum.exactness"] == "exact"
