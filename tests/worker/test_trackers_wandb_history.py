"""The W&B sink's history records (``wandb_history``), through W&B's real client offline: the
run file its service process writes (what ``wandb sync`` uploads) holds every step once, with
its values (non-finite ones too) and W&B's own ``_step``, whether the batch went over in one
coroutine or, on a client without the socket interface, one record a call; the run's summary
has each metric's last value."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from services.worker.trackers.base import StepPoints
from services.worker.trackers.wandb_files import records
from services.worker.trackers.wandb_history import HistoryPublisher, value_texts
from services.worker.trackers.wandb_tracker import run_files

wandb = pytest.importorskip("wandb")

BATCHES = [
    [StepPoints(1, {"loss": 2.5, "lr": 0.1}), StepPoints(2, {"loss": 2.0, "lr": 0.1, "val_loss": 1.5})],
    [StepPoints(3, {"loss": float("nan"), "lr": float("inf")}), StepPoints(4, {"loss": -float("inf")})],
]


def logged(root: Path, job_id: str, batched: bool) -> Path:
    settings = wandb.Settings(x_disable_stats=True, x_disable_meta=True, console="off",
                              save_code=False, disable_git=True, silent=True,
                              x_save_requirements=False)
    run = wandb.init(id=job_id, mode="offline", dir=str(root), project="p", settings=settings,
                     reinit="create_new")
    publisher = HistoryPublisher(run)
    assert publisher.batched  # the installed client has the socket interface
    publisher.batched = batched
    for points in BATCHES:
        publisher.publish(points)
    run.finish()
    (path,) = run_files(root, job_id)
    return path


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("batched", [True, False])
def test_each_step_is_one_history_record_with_its_values(tmp_path: Path, batched: bool) -> None:
    path = logged(tmp_path, f"job{int(batched)}", batched)
    rows = []
    summary: dict[str, str] = {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {item.key: json.loads(item.value_json) for item in record.history.item}
            rows.append((record.history.step.num, items))
        elif kind == "summary":
            summary.update({item.key: item.value_json for item in record.summary.update})
    want = [p for points in BATCHES for p in points]
    assert [step for step, _ in rows] == [p.step for p in want]
    for (step, items), p in zip(rows, want, strict=True):
        assert items.pop("_step") == step
        assert items.pop("_runtime") >= 0 and items.pop("_timestamp") > 0
        assert items.keys() == p.values.keys()
        assert all(same(items[k], v) for k, v in p.values.items()), (items, p.values)
    assert summary["val_loss"] == "1.5" and summary["loss"] == "-Infinity"


def test_values_are_written_as_json_reads_them() -> None:
    texts = value_texts([StepPoints(0, {"a": 0.1, "b": 1e-300, "c": float("nan"),
                                         "d": float("-inf"), "e": 3.0})])
    assert texts == ["0.1", "1e-300", "NaN", "-Infinity", "3.0"]
