"""MLflow through its official client (``mlflow-skinny``'s ``MlflowClient``).

One run per job in the experiment ACCUM_MLFLOW_EXPERIMENT, found again by its
``accum.job_id`` tag when an attempt died before recording its id; points go in one
``log_batch`` per period. The last step the run holds is read back from the server (the
history of ``loss``), so a resumed attempt never logs a step twice even when the one before
was killed between sending a batch and recording it. Credentials: MLflow's own environment
(MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN) on the worker.
"""

from __future__ import annotations

import os
import time
from typing import Any

from services.worker.trackers.base import FinalCheckpoint, RunIdentity, StepPoints

# A batch holds at most this many metrics (the server's limit is 1000).
MAX_METRICS = 1000
MAX_PARAMS = 100
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


class MlflowTracker:
    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str, register_model: str | None) -> None:
        # The client's default retries a refused connection for minutes with back-off; the
        # sink retries each period itself, so a call to a server that is down returns at once.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.client: Any = None
        self.tracking_uri, self.experiment = tracking_uri.rstrip("/"), experiment
        self.register_model = register_model
        self.run_id = ""

    def open(self, identity: RunIdentity) -> tuple[str, str | None, int | None]:
        # Imported here, in the sink's thread: a worker without the extra reports the job's
        # tracker as undelivered (an event), it does not fail the job.
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(self.tracking_uri)
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
        run_id = identity.run_id or self._tagged_run(experiment_id, identity.job_id)
        if run_id is None:
            run = self.client.create_run(experiment_id, run_name=identity.name, tags=identity.tags)
            run_id = run.info.run_id
            self._log_params(run_id, identity.params)
        self.run_id = run_id
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
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, p.step) for p in points for key, value in p.values.items()]
        run_tags = [RunTag(key, value) for key, value in tags.items()]
        for start in range(0, max(len(metrics), 1), MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + MAX_METRICS],
                                  tags=run_tags if start == 0 else [])

    def finish(self, status: str, checkpoint: FinalCheckpoint | None) -> None:
        if checkpoint is not None:
            self.client.set_tag(self.run_id, "accum.checkpoint", checkpoint.url)
            if checkpoint.local_path and os.path.exists(checkpoint.local_path):
                self.client.log_artifact(self.run_id, checkpoint.local_path, "checkpoint")
            if self.register_model:
                self._register(checkpoint, self.register_model)
        self.client.set_terminated(self.run_id, STATUS.get(status, "FINISHED"))

    def _register(self, checkpoint: FinalCheckpoint, model: str) -> None:
        """The final checkpoint as a version of the registered model (the run's artifact when
        it was uploaded, else the store's own URL)."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(model)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        uploaded = checkpoint.local_path and os.path.exists(checkpoint.local_path)
        source = (f"runs:/{self.run_id}/checkpoint/{os.path.basename(checkpoint.local_path or '')}"
                  if uploaded else checkpoint.url)
        self.client.create_model_version(model, source, self.run_id,
                                         tags={"accum.step": str(checkpoint.step)})

    def close(self) -> None:
        pass  # the client holds no resources
