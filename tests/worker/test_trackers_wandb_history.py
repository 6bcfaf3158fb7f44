"""The W&B sink's history records (``wandb_history.HistoryPublisher``).

What it still proves, and where:

- Each step is one ``HistoryRecord`` with its values (non-finite ones as JSON's ``NaN`` and
  ``Infinity``), W&B's own ``_step``, ``_runtime`` and ``_timestamp``, handed to W&B in one call
  for the whole batch (the socket interface) or, on a client without it, one call a record;
  the run's summary gets each metric's last value. Asserted on a recorded run
  (tests/worker/recorded_clients.py): what the publisher hands over, with no W&B service.
- W&B's real client offline writes those records as they are to the run file ``wandb sync``
  uploads, every step once, non-finite values too, and the summary: one real offline run,
  read back with ``wandb_files`` once the run file holds its ``exit`` record. (The job
  through a worker is tests/worker/test_trackers.py's.)

The test this replaces read the run file as soon as ``run.finish()`` returned, but W&B's service
process writes the file on its own and had sometimes written nothing yet (8 of 39 runs failed,
every time with no record at all); it also forced the one-record-a-call path on a client that
has the socket interface by flipping the publisher's ``batched``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recorded_clients import RecordedRun, until

from services.worker.trackers.base import StepPoints
from services.worker.trackers.wandb_files import records
from services.worker.trackers.wandb_history import HistoryPublisher, value_texts
from services.worker.trackers.wandb_tracker import run_files

BATCHES = [
    [StepPoints(1, {"loss": 2.5, "lr": 0.1}), StepPoints(2, {"loss": 2.0, "lr": 0.1, "val_loss": 1.5})],
    [StepPoints(3, {"loss": float("nan"), "lr": float("inf")}), StepPoints(4, {"loss": -float("inf")})],
]
WANT = [p for points in BATCHES for p in points]
LAST = {"val_loss": "1.5", "loss": "-Infinity"}  # in the run file's summary, as JSON text


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def each_step_once_with_its_values(history: list[tuple[int, dict[str, Any]]]) -> None:
    """``history``: (step, {key: value read from its JSON}) of each history record, in order."""
    assert [step for step, _ in history] == [p.step for p in WANT]
    for (step, items), p in zip(history, WANT, strict=True):
        items = dict(items)
        assert items.pop("_step") == step
        assert items.pop("_runtime") >= 0 and items.pop("_timestamp") > 0
        assert items.keys() == p.values.keys()
        assert all(same(items[k], v) for k, v in p.values.items()), (items, p.values)


def items_of(history: Any) -> dict[str, Any]:
    return {item.key: json.loads(item.value_json) for item in history.item}


@pytest.mark.parametrize("batched", [True, False], ids=["socket-interface", "one-call-a-record"])
def test_each_step_is_one_history_record_with_its_values(batched: bool) -> None:
    run = RecordedRun(batched)
    publisher = HistoryPublisher(run)
    assert publisher.batched is batched
    for points in BATCHES:
        publisher.publish(points)
    publisher.publish([])  # nothing to send: no call
    if batched:  # the whole batch in one call on W&B's asyncio thread
        assert [[h.step.num for h in batch] for batch in run.batches] == [[1, 2], [3, 4]]
        assert run.records == []
    else:
        assert run.batches == [] and [h.step.num for h in run.records] == [1, 2, 3, 4]
    each_step_once_with_its_values([(h.step.num, items_of(h)) for h in run.history()])
    runtimes = [items_of(h)["_runtime"] for h in run.history()]
    assert runtimes == sorted(runtimes)  # the batch's steps spread over its time, in order
    # One summary update a batch, with each metric's last value in it.
    assert len(run.summary.updates) == 2
    assert run.summary == {"loss": -math.inf, "lr": math.inf, "val_loss": 1.5}


def test_values_are_written_as_json_reads_them() -> None:
    texts = value_texts([StepPoints(0, {"a": 0.1, "b": 1e-300, "c": float("nan"),
                                         "d": float("-inf"), "e": 3.0})])
    assert texts == ["0.1", "1e-300", "NaN", "-Infinity", "3.0"]


def finished(path: Path) -> list[Any] | None:
    """The run file's records once W&B's service has written its last one (``exit``), else None."""
    if not path.exists():
        return None
    found = list(records(path))
    return found if any(r.WhichOneof("record_type") == "exit" for r in found) else None


@pytest.fixture(scope="module")
def offline_run_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    """One real offline W&B run the publisher logged BATCHES to: its run file's records."""
    wandb = pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("wandb")
    settings = wandb.Settings(x_disable_stats=True, x_disable_meta=True, console="off",
                              save_code=False, disable_git=True, silent=True,
                              x_save_requirements=False)
    run = wandb.init(id="job-wb", mode="offline", dir=str(root), project="p", settings=settings,
                     reinit="create_new")
    publisher = HistoryPublisher(run)
    assert publisher.batched  # the installed client has the socket interface
    for points in BATCHES:
        publisher.publish(points)
    run.finish()
    (path,) = run_files(root, "job-wb")
    # ``finish`` returns before W&B's service process has written the file: wait for its end.
    yield until(lambda: finished(path), "the run file's exit record")


def test_the_real_client_writes_each_record_to_the_run_file(offline_run_file: list[Any]) -> None:
    history = [(r.history.step.num, items_of(r.history)) for r in offline_run_file
               if r.WhichOneof("record_type") == "history"]
    each_step_once_with_its_values(history)
    summary: dict[str, str] = {}
    for record in offline_run_file:
        if record.WhichOneof("record_type") == "summary":
            summary.update({item.key: item.value_json for item in record.summary.update})
    assert {k: v for k, v in summary.items() if k in LAST} == LAST
