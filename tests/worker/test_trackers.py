"""One job logged to MLflow, TensorBoard and W&B end to end: real worker processes, the trackers'
real clients, a real MLflow tracking server started here (SQLite backend) read back through
``MlflowClient``, TensorBoard event files read back with tensorboard's ``EventAccumulator``,
W&B offline run files parsed back.

The job (one test, whose checks only read what it left) is held at step 10 with the
checkpoint of step 8 listed and every tracker past step 9 (tests/held_jobs.py), its worker
SIGKILLed there, and a second worker resumes it to step 12. What it still proves:

- every tracker holds every step of accum's own metrics once, with accum's values, across
  the killed attempt and the resumed one (a step the killed attempt delivered, re-run by the
  resume, is not sent again); the job's end waits for the trackers (all delivered at its end);
- MLflow: one run for both attempts, named after the job, FINISHED, tagged with owner, queue,
  exactness and the final checkpoint, the spec as parameters, the checkpoint as an artifact
  and as version 1 of the registered model the spec names (and, after it on the same server, a
  LoRA job's merged model as a version of ``<job name>-merged``); W&B: a run file per attempt
  (what ``wandb sync`` uploads), its records' ``_step``, ``_runtime``, ``_timestamp``, the
  summary's last values; TensorBoard: an event file per attempt;
- the job's view links to each tracker's run.

Also: a two-rank job logged once, by rank 0 (TensorBoard, in-process: the ranks are what it
tests). Against real MLflow: a flush of 1000 values and a tag within the server's limit per call
(the job's server, after the job), and the client failing at once against a server that is
down (no server).

Moved elsewhere, with what they asserted: a tracker down for the whole job and the buffer
bound (test_trackers_sink.py, recorded client; test_trackers_host.py, a real host outliving
the attempt), the resume arithmetic on PostgreSQL as well (test_trackers_sink.py), the second
backend's run of the all-trackers job (the sink's rows and events on both backends,
test_trackers_sink.py), the registered-model job (here, the same job).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from held_jobs import Hold
from recorded_clients import HANG_S, until
from worker_stack import Stack, make_stack

from bench.harness.mlflow_server import MlflowServer
from services.api.job_view import job_view
from services.jobdb import jobs, metrics
from services.jobdb.models import Job
from services.jobdb.sessions import session_factory
from services.jobdb.tracker_runs import runs_of
from services.ports import free_port
from services.worker.system_metrics import HOST_NAMES, NAMES
from services.worker.trackers.base import RunIdentity
from services.worker.trackers.sink import outage_cause
from services.worker.trackers.wandb_files import history, records
from services.worker.trackers.wandb_tracker import run_files

ALL = ["mlflow", "tensorboard", "wandb"]
# Values that are the same in every attempt (resume is exact); the timings are not.
DETERMINISTIC = ("loss", "lr", "grad_norm", "val_loss", "val_accuracy", "exactness_rel_error")
MAX_STEPS, HELD_AT, CHECKPOINT = 12, 10, 8  # checkpoint_every 4 (worker_stack.BASE_SPEC)
MODEL = "digits-mlp"


def tracker_env(stack: Stack, mlflow_uri: str) -> dict[str, str]:
    return {
        "ACCUM_TRACKERS": json.dumps(ALL), "ACCUM_MLFLOW_TRACKING_URI": mlflow_uri,
        "ACCUM_WANDB_MODE": "offline", "ACCUM_WANDB_DIR": str(stack.settings.home / "wandb"),
        # The end waits for the trackers; only a hang should make it stop waiting.
        "ACCUM_TRACKER_FLUSH_EVERY_S": "0.3", "ACCUM_TRACKER_END_WAIT_S": "240",
        # Never the internet: W&B offline, silent, nothing of the machine or the code sent.
        "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true", "WANDB_ERROR_REPORTING": "false",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    }


def delivered(stack: Stack, job_id: str) -> dict[str, tuple[int, str | None]]:
    with stack.sessions() as session:
        return {r.tracker: (r.delivered_step, r.undelivered) for r in runs_of(session, job_id)}


def ended(path: Path) -> bool:
    """W&B's service has written the run file's last record (it writes on its own, after the
    client's ``finish`` returned)."""
    return path.exists() and any(r.WhichOneof("record_type") == "exit" for r in records(path))


@dataclass
class TrackedJob:
    stack: Stack
    job_id: str
    job: Job
    delivered_at_end: dict[str, tuple[int, str | None]]
    mlflow_uri: str

    @property
    def wandb_dir(self) -> Path:
        return self.stack.settings.home / "wandb" / self.job_id

    @property
    def tensorboard_dir(self) -> Path:
        return self.stack.settings.artifacts_path / "tensorboard" / self.job_id


@contextlib.contextmanager
def tracked_job(tmp: Path, request: pytest.FixtureRequest) -> Iterator[tuple[TrackedJob, MlflowServer]]:
    """The one job (SQLite database and broker, a home of its own) and the MLflow server it logs
    to: held at step 10, its worker SIGKILLed, resumed by the other worker, ended."""
    stack = make_stack("sqlite", tmp, request)
    server = MlflowServer(tmp / "mlflow", free_port())
    hold = Hold(tmp / "gate")
    env = {**tracker_env(stack, server.uri), **hold.env()}
    try:
        stack.start_worker(**env)  # importing torch while the server starts
        stack.start_worker(**env)
        server.start()  # ~20-60 s on a busy machine
        job_id = hold.create(stack, trackers=ALL, eval_every=4, name="digits-tracked",
                             register_model=MODEL, max_steps=MAX_STEPS,
                             dataset=Hold.dataset(step=HELD_AT, micro_batches=2))
        hold.wait_held(stack, job_id, processes=1, step=HELD_AT, checkpoint=CHECKPOINT)
        # Step 10 is the last: held back (an evaluation may follow). The rest is delivered.
        until(lambda: all(delivered(stack, job_id).get(name, (-1, None))[0] >= HELD_AT - 1 for name in ALL),
              "every tracker past step 9", lambda: (delivered(stack, job_id), stack.worker_logs()))
        victim = stack.process_holding(job_id)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        hold.release()
        job = stack.wait(job_id, timeout=HANG_S)
        at_end = delivered(stack, job_id)
        run_file = run_files(stack.settings.home / "wandb" / job_id, job_id)[-1]
        until(lambda: ended(run_file), "the last W&B run file's exit record")
        yield TrackedJob(stack, job_id, job, at_end, server.uri), server
    finally:
        hold.release()
        stack.stop_workers()
        server.stop()


@pytest.mark.timeout(2 * HANG_S)  # a server and two workers starting, two attempts, on 2 cores
@pytest.mark.slow
def test_one_job_reaches_mlflow_tensorboard_and_wandb_once_across_a_sigkill(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One test, so that under xdist the job runs once (a module fixture would run on each
    worker that takes one of its tests); each check below reads what the job left."""
    with tracked_job(tmp_path, request) as (job, server):
        the_killed_job_resumed_and_its_end_waited_for_every_tracker(job)
        mlflow_has_one_finished_run_with_every_step_once(job)
        the_final_checkpoint_is_a_version_of_the_registered_model(job)
        tensorboard_has_an_event_file_an_attempt_and_every_step_once(job)
        wandb_has_a_run_file_an_attempt_and_every_step_once(job)
        the_jobs_view_links_to_each_trackers_run(job)
        a_flush_of_1000_values_and_a_tag_reaches_mlflow_in_calls_within_its_limit(server)
        a_lora_jobs_merged_model_is_a_version_named_after_the_job(job, tmp_path)


def accum_points(stack: Stack, job_id: str) -> dict[str, list[tuple[int, float]]]:
    """accum's own metrics API's points: name -> (step, value), by step."""
    with stack.sessions() as session:
        rows, _ = metrics.read_metrics(session, job_id, limit=1_000_000)
    points: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        if row.value is not None:
            points.setdefault(row.name, []).append((row.step, row.value))
    return points


# Sampled, not trained (services.worker.system_metrics): neither reproducible nor resumed.
SAMPLED = frozenset(HOST_NAMES) | frozenset(NAMES)


def same_steps_and_values(got: dict[str, list[tuple[int, float]]],
                          want: dict[str, list[tuple[int, float]]], rel: float = 0.0) -> None:
    assert sorted(got) == sorted(want)
    for name, points in want.items():
        if name in SAMPLED:
            # A system sample joins a step of the attempt that took it: a step the killed attempt
            # delivered and the next one trained again keeps the tracker's first (the tracker
            # skips whole steps it has), the store the second attempt's.
            assert got[name] and {s for s, _ in got[name]} <= {s for s, _ in points}, name
            continue
        assert [s for s, _ in got[name]] == [s for s, _ in points], name  # each step once
        if name in DETERMINISTIC:
            assert [v for _, v in got[name]] == pytest.approx([v for _, v in points], rel=rel), name


def mlflow_run(uri: str, job_id: str) -> Any:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("accum")
    runs = client.search_runs([experiment.experiment_id], f"tags.`accum.job_id` = '{job_id}'")
    assert len(runs) == 1, f"one MLflow run per job, got {len(runs)}"
    return client, runs[0]


def the_killed_job_resumed_and_its_end_waited_for_every_tracker(tracked_job: TrackedJob) -> None:
    job = tracked_job.job
    assert job.status == "succeeded", (job.error, tracked_job.stack.worker_logs())
    assert job.attempts == 2 and job.resume_step == CHECKPOINT
    want = accum_points(tracked_job.stack, tracked_job.job_id)
    assert {"loss", "lr", "val_loss", "exactness_rel_error", "host_cpu_percent", "process_rss_bytes"} <= set(want)
    assert tracked_job.delivered_at_end == {name: (MAX_STEPS, None) for name in ALL}


def mlflow_has_one_finished_run_with_every_step_once(tracked_job: TrackedJob) -> None:
    stack, job_id = tracked_job.stack, tracked_job.job_id
    client, run = mlflow_run(tracked_job.mlflow_uri, job_id)  # one run for both attempts
    assert run.info.run_name == "digits-tracked" and run.info.status == "FINISHED"
    assert run.data.tags["accum.owner"] == stack.owner.name
    assert run.data.tags["accum.queue"] == stack.queue
    assert run.data.tags["accum.exactness"] == "exact"
    assert run.data.tags["accum.checkpoint"] == f"{stack.settings.artifacts_url}/{job_id}/{MAX_STEPS}.pt"
    assert run.data.params["optimizer.lr"] == "0.05" and run.data.params["max_steps"] == str(MAX_STEPS)
    assert run.data.params["effective_batch_size"].isdigit()  # m x N x ranks, not "None"
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")] == [f"checkpoint/{MAX_STEPS}.pt"]
    want = accum_points(stack, job_id)
    got = {name: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
           for name in want}
    same_steps_and_values(got, want)  # doubles, exactly


def the_final_checkpoint_is_a_version_of_the_registered_model(tracked_job: TrackedJob) -> None:
    client, run = mlflow_run(tracked_job.mlflow_uri, tracked_job.job_id)
    run_id = run.info.run_id
    [version] = client.search_model_versions(f"name = '{MODEL}'")
    assert version.version == "1" and version.run_id == run_id
    assert version.source == f"runs:/{run_id}/checkpoint/{MAX_STEPS}.pt"
    assert version.tags == {"accum.step": str(MAX_STEPS)}


# A LoRA job with peft.merge on the same worker and server, after the job above: 2 steps of
# a tiny GPT-2 built from its config (no download) on the shipped text.
LORA: dict[str, Any] = {
    "model": {"name": "hf:gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2, "n_positions": 128},
    "dataset": "text", "micro_batch_size": 2, "accumulation_steps": 2, "max_steps": 2, "checkpoint_every": 2,
    "optimizer": {"name": "adamw", "lr": 1e-2},
    "peft": {"method": "lora", "r": 2, "target_modules": ["c_attn"], "merge": True},
}


def a_lora_jobs_merged_model_is_a_version_named_after_the_job(tracked_job: TrackedJob, tmp: Path) -> None:
    """Its checkpoints hold the adapters only: what MLflow registers is the merged model (the
    run's artifact folder merged, loading with from_pretrained), a version of <job name>-merged
    when the spec names no register_model."""
    from transformers import GPT2LMHeadModel

    stack = tracked_job.stack
    job_id = stack.create(name="lora-tracked", trackers=["mlflow"], **LORA)
    job = stack.wait(job_id, timeout=HANG_S)  # the job's end waits for its trackers
    assert job.status == "succeeded", (job.error, stack.worker_logs())
    client, run = mlflow_run(tracked_job.mlflow_uri, job_id)
    [version] = client.search_model_versions("name = 'lora-tracked-merged'")
    assert version.run_id == run.info.run_id and version.source == f"runs:/{run.info.run_id}/merged"
    assert version.tags == {"accum.merged": "true", "accum.step": "2"}
    folder = client.download_artifacts(run.info.run_id, "merged", str(tmp))
    merged = GPT2LMHeadModel.from_pretrained(folder)
    assert merged.config.n_layer == 2 and not any("lora_" in name for name, _ in merged.named_parameters())


def tensorboard_points(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def tensorboard_has_an_event_file_an_attempt_and_every_step_once(tracked_job: TrackedJob) -> None:
    logdir = tracked_job.tensorboard_dir
    assert len(list(logdir.iterdir())) == 2  # one event file per attempt
    same_steps_and_values(tensorboard_points(logdir), accum_points(tracked_job.stack, tracked_job.job_id),
                          rel=1e-6)  # float32 in event files


def wandb_has_a_run_file_an_attempt_and_every_step_once(tracked_job: TrackedJob) -> None:
    job_id = tracked_job.job_id
    paths = run_files(tracked_job.wandb_dir, job_id)
    assert len(paths) == 2  # `wandb sync` uploads both to run job_id
    got: dict[str, list[tuple[int, float]]] = {}
    for path in paths:
        for step, values in history(path):
            for name, value in values.items():
                got.setdefault(name, []).append((step, value))
    want = accum_points(tracked_job.stack, job_id)
    same_steps_and_values(got, want)
    # W&B's own keys on each record, and the summary's last value of each metric.
    summary: dict[str, Any] = {}
    for path in paths:
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {item.key: json.loads(item.value_json) for item in record.history.item}
                assert items["_step"] == record.history.step.num
                assert items["_runtime"] >= 0 and items["_timestamp"] > 0
            elif kind == "summary":
                summary.update({item.key: json.loads(item.value_json) for item in record.summary.update})
    assert set(want) <= set(summary)
    assert {name: summary[name] for name in want if name in DETERMINISTIC} == {
        name: points[-1][1] for name, points in want.items() if name in DETERMINISTIC}
    assert summary["accum.status"] == "succeeded"


def the_jobs_view_links_to_each_trackers_run(tracked_job: TrackedJob) -> None:
    stack, job_id = tracked_job.stack, tracked_job.job_id
    _, run = mlflow_run(tracked_job.mlflow_uri, job_id)
    with stack.sessions() as session:  # what GET /v1/jobs/{id} and the dashboard show
        view = job_view(session, jobs.load_job(session, job_id), stack.owner.name)
    links = {link.tracker: link for link in view.trackers or []}
    assert links["mlflow"].url == (f"{tracked_job.mlflow_uri}/#/experiments/"
                                   f"{run.info.experiment_id}/runs/{run.info.run_id}")
    assert links["tensorboard"].run_id == job_id and links["wandb"].run_id == job_id


@pytest.mark.slow
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


def a_flush_of_1000_values_and_a_tag_reaches_mlflow_in_calls_within_its_limit(mlflow_server: MlflowServer) -> None:
    """The server counts metrics, params and tags of a log-batch call together (at most 1000):
    a flush of 1000 values with a tag was refused, and the sink retried it forever (a fast job
    fills a flush with that many)."""
    from mlflow.tracking import MlflowClient

    from services.worker.trackers.base import StepPoints
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


def test_mlflows_client_fails_at_once_against_a_server_that_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes a down server an outage the sink reports and retries each period: the call
    raises, and soon (the client's default retries a refused connection for minutes)."""
    from services.worker.trackers.mlflow_tracker import MlflowTracker

    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)  # the tracker's own defaults, undone after
    tracker = MlflowTracker(f"http://127.0.0.1:{free_port()}", "accum", None)  # nothing listens
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        tracker.open(RunIdentity(job_id="down-job", name="down", owner="o", queue="q", params={}))
    assert time.monotonic() - started < 60, "the client retried a refused connection"
    # What the sink's tracker_undelivered event says of it: the server, not a missing client.
    assert outage_cause(raised.value, "mlflow") == (
        "server refused the connection", "is it running at ACCUM_MLFLOW_TRACKING_URI?")
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0", raised.value
