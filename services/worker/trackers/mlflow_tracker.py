"""MLflow through its official client (``mlflow-skinny``'s ``MlflowClient``).

One run per job in the experiment ACCUM_MLFLOW_EXPERIMENT, found again by its
``accum.job_id`` tag when an attempt died before recording its id; points go to the tracking
server's REST ``log-batch`` (ACCUM_MLFLOW_TRACKING_URI: an http(s) server), a thousand values a
call, each period. The last step the run holds is read back from the server (the
history of ``loss``), so a resumed attempt never logs a step twice even when the one before
was killed between sending a batch and recording it. Credentials: MLflow's own environment
(MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN) on the worker.

At the job's end the final checkpoint is the run's artifact, and a version of the spec's
``register_model``. A LoRA job with ``peft.merge`` (its checkpoints hold adapters only) has
its merged model (``<job>/merged.tar``) logged as the artifact folder ``merged`` and registered
instead: a version of ``register_model``, or of ``<job name>-merged`` when the spec names none.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from services.artifacts import ArtifactStore
from services.worker.trackers.base import FinalCheckpoint, RunIdentity, StepPoints

# A batch holds at most this many metrics and tags (the server's limit is 1000).
MAX_METRICS = 1000
MAX_PARAMS = 100
LOG_BATCH = "/api/2.0/mlflow/runs/log-batch"
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


class MlflowTracker:
    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str, register_model: str | None,
                 merged: MergedModel | None = None) -> None:
        # The client's default retries a refused connection for minutes with back-off; the
        # sink retries each period itself, so a call to a server that is down returns at once.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.client: Any = None
        self.tracking_uri, self.experiment = tracking_uri.rstrip("/"), experiment
        self.register_model = register_model
        self.merged = merged
        self.run_name = ""
        self.run_id = ""
        self.creds: Callable[[], Any] = lambda: None
        self._key_json = KeyJson()

    def open(self, identity: RunIdentity) -> tuple[str, str | None, int | None]:
        # Imported here, in the sink's thread: a worker without the extra reports the job's
        # tracker as undelivered (an event), it does not fail the job.
        from mlflow.tracking import MlflowClient
        from mlflow.utils.credentials import get_default_host_creds

        self.client = MlflowClient(self.tracking_uri)
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
        run_id = identity.run_id or self._tagged_run(experiment_id, identity.job_id)
        if run_id is None:
            run = self.client.create_run(experiment_id, run_name=identity.name, tags=identity.tags)
            run_id = run.info.run_id
            self._log_params(run_id, identity.params)
        self.run_id, self.run_name = run_id, identity.name
        self.creds = partial(get_default_host_creds, self.tracking_uri)
        held = [m.step for m in self.client.get_metric_history(run_id, "loss")]
        url = f"{self.tracking_uri}/#/experiments/{experiment_id}/runs/{run_id}"
        return run_id, url, max(held, default=-1)

    def _tagged_run(self, experiment_id: str, job_id: str) -> str | None:
        runs = self.client.search_runs([experiment_id], f"tags.`accum.job_id` = '{job_id}'",
                                       max_results=1)
        return runs[0].info.run_id if runs else None

    def _log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value[:6000]) for key, value in params.items()]
        for start in range(0, len(items), MAX_PARAMS):
            self.client.log_batch(run_id, params=items[start:start + MAX_PARAMS])

    def send(self, points: list[StepPoints], tags: dict[str, str]) -> None:
        """One ``log-batch`` call per MAX_METRICS values, its body written here: the client's
        ``log_batch`` makes a ``Metric`` entity and a protobuf message per value and turns
        them into JSON (the bench measured ~150 us a 7-metric step, in the thread that competes
        with training for the GIL, against a few us this way)."""
        from mlflow.utils.rest_utils import http_request_safe

        body = {"run_id": self.run_id, "tags": [{"key": k, "value": v} for k, v in tags.items()]}
        objects = log_batch_metrics(points, int(time.time() * 1000), self._key_json)
        for metrics in batches_of(objects, len(body["tags"])) or [[]]:
            http_request_safe(self.creds(), LOG_BATCH, "POST", data=batch_json(body, metrics),
                              extra_headers={"Content-Type": "application/json"})
            body["tags"] = []

    def finish(self, status: str, checkpoint: FinalCheckpoint | None) -> None:
        merged = status == "succeeded" and self.merged is not None and self._log_merged(self.merged)
        if checkpoint is not None:
            self.client.set_tag(self.run_id, "accum.checkpoint", checkpoint.url)
            if checkpoint.local_path and os.path.exists(checkpoint.local_path):
                self.client.log_artifact(self.run_id, checkpoint.local_path, "checkpoint")
            if self.register_model and not merged:
                self._register(checkpoint, self.register_model)
        if merged:
            self._register_merged(checkpoint)
        self.client.set_terminated(self.run_id, STATUS.get(status, "FINISHED"))

    def _log_merged(self, merged: MergedModel) -> bool:
        """The LoRA job's merged model (``peft.merge``: ``<job>/merged.tar`` in the store) as
        the run's artifact folder ``merged`` (what ``from_pretrained`` loads); False when the
        store has none (the job stored none: nothing to register)."""
        if merged.store.head(merged.key) is None:
            return False
        with tempfile.TemporaryDirectory(prefix="accum-merged-") as folder:
            packed = Path(folder) / "merged.tar"
            merged.store.get(merged.key, packed)
            with tarfile.open(packed) as tar:
                tar.extractall(folder, filter="data")
            self.client.log_artifacts(self.run_id, str(Path(folder) / "merged"), "merged")
        return True

    def _register_merged(self, checkpoint: FinalCheckpoint | None) -> None:
        """The merged model as a version of ``register_model``, else of the registered model
        named after the job (``merged_model_name``): a model that loads whole, where the
        final checkpoint holds the adapters only."""
        tags = {"accum.merged": "true"} | ({"accum.step": str(checkpoint.step)} if checkpoint else {})
        self._register_source(self.register_model or merged_model_name(self.run_name),
                              f"runs:/{self.run_id}/merged", tags)

    def _register(self, checkpoint: FinalCheckpoint, model: str) -> None:
        """The final checkpoint as a version of the registered model (the run's artifact when
        it was uploaded, else the store's own URL)."""
        uploaded = checkpoint.local_path and os.path.exists(checkpoint.local_path)
        source = (f"runs:/{self.run_id}/checkpoint/{os.path.basename(checkpoint.local_path or '')}"
                  if uploaded else checkpoint.url)
        self._register_source(model, source, {"accum.step": str(checkpoint.step)})

    def _register_source(self, model: str, source: str, tags: dict[str, str]) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(model)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        # A finish retried after the version was made (the set_terminated after it failed)
        # makes no second one: the run's versions of the model are looked up first.
        made = self.client.search_model_versions(f"name = '{escaped(model)}' and run_id = '{self.run_id}'")
        if not any(version.source == source for version in made):
            self.client.create_model_version(model, source, self.run_id, tags=tags)

    def close(self) -> None:
        pass  # the client holds no resources


@dataclass(frozen=True)
class MergedModel:
    """Where a ``peft.merge`` job's merged model is: its tar's key in the artifact store."""

    store: ArtifactStore
    key: str


def merged_model_name(run_name: str) -> str:
    """The registered model a merged LoRA model is a version of when the spec names none: the
    job's name (its id when unnamed) and ``-merged``, MLflow's forbidden ``/`` and ``:`` as ``-``."""
    return re.sub(r"[/:]", "-", run_name) + "-merged"


def escaped(text: str) -> str:
    """``text`` inside a single-quoted MLflow search string."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


class KeyJson(dict[str, str]):
    """A metric's name -> the start of its JSON object, ``{"key":"loss","value":``."""

    def __missing__(self, key: str) -> str:
        self[key] = text = f'{{"key":{json.dumps(key)},"value":'
        return text


def batches_of(objects: list[str], tags: int) -> list[list[str]]:
    """The metric objects in ``log-batch`` calls of at most MAX_METRICS items, the first call
    carrying the ``tags`` too (the server counts metrics, params and tags together: a first
    call of 1000 metrics and a tag was refused, and retried forever)."""
    first = MAX_METRICS - tags
    head = [objects[:first]] if objects else []
    return head + [objects[start:start + MAX_METRICS] for start in range(first, len(objects), MAX_METRICS)]


def log_batch_metrics(points: list[StepPoints], timestamp_ms: int, key_json: KeyJson) -> list[str]:
    """The points as ``log-batch`` metric objects (JSON text).

    Each value is written by one ``%.17g`` over all of them (the shortest text that reads back
    as the same double, ~0.4 us a value, against ~1 us for ``json.dumps`` of a dict each);
    non-finite ones as the JSON strings MLflow's server reads as NaN and infinities."""
    names: list[str] = []
    values: list[float] = []
    tails: list[str] = []
    for p in points:
        names.extend(p.values)
        values.extend(p.values.values())
        tails.extend([f',"timestamp":{timestamp_ms},"step":{p.step}}}'] * len(p.values))
    text = ",".join(["%.17g"] * len(values)) % tuple(values)  # noqa: UP031 - one call for all
    numbers = text.split(",") if values else []
    if "n" in text:  # only "nan" and "inf" have one
        numbers = [NON_FINITE.get(number, number) for number in numbers]
    return list(map("".join, zip(map(key_json.__getitem__, names), numbers, tails, strict=True)))


NON_FINITE = {"nan": '"NaN"', "inf": '"Infinity"', "-inf": '"-Infinity"'}


def batch_json(body: dict[str, Any], metrics: list[str]) -> bytes:
    """``body`` (run id, tags) with the metric objects as its ``metrics`` list."""
    head = json.dumps(body)[:-1]
    return f'{head},"metrics":[{",".join(metrics)}]}}'.encode()
