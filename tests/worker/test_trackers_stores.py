"""Where a job's tracker runs end up, in-process (``run_job``) with the trackers' real clients:
TensorBoard event files under an ``s3://`` artifact store (moto's S3 server) read back the way
``tensorboard --logdir s3://.../tensorboard`` reads them (tensorboard's S3 file system), and
the final checkpoint registered as a model version in a real MLflow server when the spec
names ``register_model``. The event file writer itself is checked against tensorboard's
reader on a batch with evaluations, step numbers of every width and non-finite values."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from job_specs import TINY_SPEC

from bench.harness.mlflow_server import MlflowServer
from services.jobdb import metrics
from services.jobdb.sessions import session_factory
from services.jobdb.tracker_runs import runs_of
from services.ports import free_port
from services.settings import Settings
from services.worker.runner import run_job
from services.worker.trackers.base import StepPoints
from services.worker.trackers.tensorboard_events import EventFiles

SPEC = {**TINY_SPEC, "max_steps": 6, "eval_every": 3}


def accum_points(settings: Settings, job_id: str) -> dict[str, list[tuple[int, float]]]:
    with session_factory(settings)() as session:
        rows, _ = metrics.read_metrics(session, job_id, limit=100_000)
    points: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        if row.value is not None:
            points.setdefault(row.name, []).append((row.step, row.value))
    return points


def scalars(accumulator: Any) -> dict[str, list[tuple[int, float]]]:
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def same_points(got: dict[str, list[tuple[int, float]]],
                want: dict[str, list[tuple[int, float]]]) -> None:
    assert sorted(got) == sorted(want)
    for name, points in want.items():
        assert [s for s, _ in got[name]] == [s for s, _ in points], name  # each step once
        assert [v for _, v in got[name]] == pytest.approx([v for _, v in points], rel=1e-6,
                                                          nan_ok=True), name  # float32 in files


def test_tensorboard_event_files_on_s3_are_what_tensorboard_reads_from_the_store(
    settings: Settings, make_job: Callable[..., str], s3_url: str, s3_server: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    tracked = settings.model_copy(update={"artifacts_url": s3_url, "trackers": ["tensorboard"],
                                          "tracker_flush_every_s": 0.2})
    job_id = make_job({**SPEC, "trackers": ["tensorboard"]})
    assert run_job(tracked, job_id, "node-a") == "succeeded"
    with session_factory(tracked)() as session:
        [run] = runs_of(session, job_id)
    assert (run.tracker, run.delivered_step, run.undelivered) == ("tensorboard", 6, None)
    # Nothing under the node's local artifacts directory: the files are objects in the store.
    assert not (tracked.artifacts_path / "tensorboard").exists()

    # tensorboard's own S3 file system (boto3), pointed at moto as at any S3 endpoint.
    monkeypatch.setenv("S3_ENDPOINT", s3_server.endpoint)
    logdir = f"{s3_url}/tensorboard"
    runs = EventMultiplexer().AddRunsFromDirectory(logdir)
    assert list(runs.Runs()) == [job_id]  # `tensorboard --logdir s3://.../tensorboard`: a run a job
    want = accum_points(tracked, job_id)
    assert {"loss", "val_loss", "exactness_rel_error"} <= set(want)
    accumulator = EventAccumulator(f"{logdir}/{job_id}", size_guidance={"scalars": 0, "tensors": 0})
    same_points(scalars(accumulator), want)
    texts = accumulator.Tags()["tensors"]
    assert {"accum/spec/text_summary", "accum/status/text_summary",
            "accum/checkpoint/text_summary"} <= set(texts)
    [status] = accumulator.Tensors("accum/status/text_summary")
    assert status.tensor_proto.string_val == [b"succeeded"]


def test_event_files_hold_every_step_once_in_order(tmp_path: Path) -> None:
    """Steps of 1 to 4 varint bytes, evaluations every 7 steps (another layout in the same
    batch), NaN and infinities; a resumed writer's purge marker drops the first file's steps
    from there on, as torch's ``SummaryWriter(purge_step=...)`` does."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def points(steps: range) -> list[StepPoints]:
        out = []
        for step in steps:
            values = {"loss": 1 / (step + 3), "lr": 0.05}
            if step % 7 == 0:
                values.update(val_loss=math.nan if step == 14 else -math.inf, val_accuracy=0.5)
            out.append(StepPoints(step, values))
        return out

    first = EventFiles(tmp_path, None)
    first.scalars(points(range(0, 200)))
    first.scalars(points(range(200, 300)))
    first.scalars([*points(range(16_000, 16_500)), *points(range(2_097_000, 2_097_200))])
    first.close()
    second = EventFiles(tmp_path, 2_097_100)  # a later attempt resumed after step 2097099
    second.scalars(points(range(2_097_100, 2_097_300)))
    second.close()
    assert len(list(tmp_path.iterdir())) == 2
    got = scalars(EventAccumulator(str(tmp_path), size_guidance={"scalars": 0}))
    kept = [*points(range(0, 300)), *points(range(16_000, 16_500)),
            *points(range(2_097_000, 2_097_300))]
    same_points(got, {name: [(p.step, p.values[name]) for p in kept if name in p.values]
                      for name in ("loss", "lr", "val_loss", "val_accuracy")})


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path / "mlflow", free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_final_checkpoint_is_a_version_of_the_registered_model(
    settings: Settings, make_job: Callable[..., str], mlflow_server: MlflowServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    tracked = settings.model_copy(update={"trackers": ["mlflow"], "tracker_flush_every_s": 0.2,
                                          "mlflow_tracking_uri": mlflow_server.uri})
    spec = {**SPEC, "checkpoint_every": 3, "trackers": ["mlflow"], "register_model": "digits-mlp"}
    job_id = make_job(spec)
    assert run_job(tracked, job_id, "node-a") == "succeeded"
    with session_factory(tracked)() as session:
        [run] = runs_of(session, job_id)
    assert (run.delivered_step, run.undelivered) == (6, None) and run.run_id is not None
    run_id = run.run_id

    client = MlflowClient(mlflow_server.uri)
    [version] = client.search_model_versions("name = 'digits-mlp'")
    assert version.version == "1" and version.run_id == run_id
    assert version.source == f"runs:/{run_id}/checkpoint/6.pt"
    assert version.tags == {"accum.step": "6"}
    assert [a.path for a in client.list_artifacts(run_id, "checkpoint")] == ["checkpoint/6.pt"]
    held = client.get_run(run_id)
    assert held.info.status == "FINISHED"
    assert held.data.tags["accum.checkpoint"] == f"{tracked.artifacts_url}/{job_id}/6.pt"
    loss = [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")]
    assert sorted(loss) == accum_points(tracked, job_id)["loss"]  # doubles, exactly
