"""What a tracker's sink takes from the training thread at each flush: whole steps only (an
evaluation joins its step's metrics even when a flush falls between the two), numbers only,
without the ``step`` and ``epoch`` coordinates, the last step held back until a later one
starts or the attempt ends."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import sessionmaker

from services.artifacts import open_store
from services.settings import Settings
from services.worker.trackers.base import RunIdentity
from services.worker.trackers.callback import TrackerCallback
from services.worker.trackers.handover import TrackerHost
from services.worker.trackers.sink import TrackerSink
from services.worker.trackers.tensorboard_tracker import TensorBoardTracker

IDENTITY = RunIdentity(job_id="j", name="j", owner="o", queue="q", params={})


def sink(tmp_path: Path) -> TrackerSink:
    """A sink that is never started: the test plays its thread's part (``_take``)."""
    tracker = TensorBoardTracker(open_store(tmp_path.as_uri()), tmp_path, "")
    return TrackerSink(tracker, sessionmaker(), IDENTITY, attempt=1, flush_every_s=60)


def handed_over(host: TrackerHost, s: TrackerSink) -> None:
    """What the host process's main thread does with a batch (``host.host_main``)."""
    raw, commands = host.take()
    for metrics in raw:
        s.push(metrics)
    for command, *args in commands:
        getattr(s, command)(*args)


def taken(s: TrackerSink) -> list[tuple[int, dict[str, float]]]:
    return [(p.step, p.values) for p in s._waiting]


def test_a_step_is_taken_whole_once_a_later_step_started(tmp_path: Path) -> None:
    s = sink(tmp_path)
    host = TrackerHost(Settings(home=tmp_path), {}, 1, {"tensorboard": IDENTITY}, sessionmaker())
    callback = TrackerCallback(host, uploads=None, end_wait_s=0)  # type: ignore[arg-type]
    callback.on_step(None, {"step": 1.0, "epoch": 0.0, "loss": 2.5, "lr": 0.1})
    callback.on_event(None, "exactness_check", "", {"passed": True, "rel_error": 1e-9})
    callback.on_step(None, {"step": 2.0, "epoch": 0.0, "loss": 2.0, "peak_memory_bytes": 7})
    handed_over(host, s)
    assert s._tags == {"accum.exactness": "exact"}
    s._take(ending=False)
    # Step 2 may still get an evaluation: held back. Step 0 (the exactness check) is whole.
    assert taken(s) == [(1, {"loss": 2.5, "lr": 0.1}), (0, {"exactness_rel_error": 1e-9})]
    callback.on_eval(None, {"step": 2.0, "epoch": 0.0, "val_loss": 1.5, "flag": True})
    handed_over(host, s)
    s._take(ending=False)
    assert len(taken(s)) == 2  # still step 2 last: still held
    callback.on_step(None, {"step": 3.0, "epoch": 0.0, "loss": 1.0})
    handed_over(host, s)
    s._take(ending=False)
    assert taken(s)[2:] == [(2, {"loss": 2.0, "peak_memory_bytes": 7.0, "val_loss": 1.5})]
    s._take(ending=True)  # the attempt's end: the last step goes too
    assert taken(s)[3:] == [(3, {"loss": 1.0})]
    assert s._tags == {} and s._raw == []
