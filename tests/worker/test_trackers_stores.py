"""Where a job's TensorBoard files end up, and the event file writer itself.

What it still proves:

- Under an ``s3://`` artifact store (moto's S3 server) the tracker the host builds for a job
  (``host.make_tracker``: written in the node's staging folder, each batch uploaded through the
  store) leaves nothing under the node's local artifacts folder, and the objects are what
  ``tensorboard --logdir s3://.../tensorboard`` reads (tensorboard's own S3 file system): one
  run a job, every step once with its value (evaluations and the exactness point too), the
  spec, the job's status and the final checkpoint as text; the run's row says every step was
  delivered. Driven through the job's sink (a real ``TrackerSink``, what the host process runs)
  rather than a training job: that one trained a job in-process (torch, a host process) for
  points the sink test hands over just the same; the training-to-tracker path is
  tests/worker/test_trackers.py's end-to-end job and tests/worker/test_trackers_host.py's.
- The event file writer against tensorboard's reader: a batch with evaluations, step numbers
  of every width, non-finite values, and a resumed writer's purge marker.

The registered model (the final checkpoint as version 1 of the model the spec names, against a
real MLflow server) is now asserted on tests/worker/test_trackers.py's end-to-end job: this
module started an MLflow server of its own for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from job_specs import TINY_SPEC
from recorded_clients import HANG_S

from services.jobdb.sessions import session_factory
from services.jobdb.tracker_runs import runs_of
from services.settings import Settings
from services.spec import parse_spec
from services.worker.checkpoints.stores import artifact_store, node_cache
from services.worker.checkpoints.uploads import CheckpointUploads
from services.worker.trackers.base import FinalCheckpoint, RunIdentity, StepPoints
from services.worker.trackers.host import make_tracker
from services.worker.trackers.job import run_params
from services.worker.trackers.sink import TrackerSink, ensure_row
from services.worker.trackers.tensorboard_events import EventFiles

SPEC = {**TINY_SPEC, "max_steps": 6, "eval_every": 3}


def trained(steps: range) -> list[dict[str, Any]]:
    """The metrics dicts a training attempt hands over: each step's, an evaluation every 3
    steps, the exactness check's point (step 0)."""
    raw: list[dict[str, Any]] = [{"step": 0.0, "exactness_rel_error": 1e-9}]
    for step in steps:
        raw.append({"step": float(step), "epoch": 0.0, "loss": 1 / (step + 1), "lr": 0.1})
        if step % 3 == 0:
            raw.append({"step": float(step), "epoch": 0.0, "val_loss": 2 / (step + 1)})
    return raw


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

    tracked = settings.model_copy(update={"artifacts_url": s3_url, "trackers": ["tensorboard"]})
    spec = parse_spec({**SPEC, "trackers": ["tensorboard"]})
    job_id = make_job({**SPEC, "trackers": ["tensorboard"]})
    uploads = CheckpointUploads(artifact_store(tracked), node_cache(tracked), job_id,
                                retry_for_s=tracked.lease_timeout_s)
    sessions = session_factory(tracked)
    ensure_row(sessions, job_id, "tensorboard")
    identity = RunIdentity(job_id=job_id, name=job_id, owner="o", queue="default", params=run_params(spec))
    # What the host process runs for the job: the tracker it builds, a sink around it.
    sink = TrackerSink(make_tracker("tensorboard", tracked, spec, uploads), sessions, identity,
                       attempt=1, flush_every_s=0.05)
    sink.start()
    sink.tag("accum.exactness", "exact")
    raw = trained(range(1, 7))
    for metrics_ in raw:
        sink.push(metrics_)
    sink.end("succeeded", FinalCheckpoint(6, f"{s3_url}/{job_id}/6.pt", None))
    assert sink.done.wait(HANG_S), "the points never reached the store"
    with sessions() as session:
        [run] = runs_of(session, job_id)
    assert (run.tracker, run.delivered_step, run.undelivered) == ("tensorboard", 6, None)
    # Nothing under the node's local artifacts directory: the files are objects in the store.
    assert not (tracked.artifacts_path / "tensorboard").exists()

    # tensorboard's own S3 file system (boto3), pointed at moto as at any S3 endpoint.
    monkeypatch.setenv("S3_ENDPOINT", s3_server.endpoint)
    logdir = f"{s3_url}/tensorboard"
    runs = EventMultiplexer().AddRunsFromDirectory(logdir)
    assert list(runs.Runs()) == [job_id]  # `tensorboard --logdir s3://.../tensorboard`: a run a job
    want: dict[str, list[tuple[int, float]]] = {}
    for metrics_ in raw:
        for name, value in metrics_.items():
            if name not in ("step", "epoch"):
                want.setdefault(name, []).append((int(metrics_["step"]), value))
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
