"""A tracker's sink (``sink.TrackerSink``) with a recorded client (tests/worker/recorded_clients.py)
and accum's real store, on both database backends.

What it still proves:

- What the sink takes from the training side at each flush: whole steps only (an evaluation
  joins its step's metrics even when a flush falls between the two), numbers only, without
  the ``step`` and ``epoch`` coordinates, the last step held back until a later one starts or
  the attempt ends.
- A tracker down for a whole attempt (its client raising, as MLflow's does against a server
  that is down) never holds the job's end up: the sink records ``tracker_undelivered`` (the
  row's ``undelivered``, nothing delivered), retries each period, and once the tracker is back
  delivers every step once, in order, with the tags set meanwhile, finishes the run with the
  job's status and final checkpoint, and records ``tracker_delivered`` and the run's id and
  address (what the job's view links to). With a buffer bound below the job's steps the
  oldest are let go and read back from accum's metrics store: still every step once.
  (These were end-to-end tests with a second MLflow server started after the job; that MLflow's
  client raises at once against a server that is down is test_trackers.py's, and the points
  reaching a real server its end-to-end job's.)
- A resumed attempt sends each step once: after the last step the run holds by the tracker's
  own account (or, where it keeps none, the row's), first the earlier attempts' steps up to
  the checkpoint it resumed from (from the store), then its own, the exactness check's step 0
  not again. (The SIGKILLed job through real trackers is test_trackers.py's end-to-end job.)
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from job_specs import TINY_SPEC
from recorded_clients import RecordedTracker, until
from sqlalchemy.orm import Session, sessionmaker

from services.api.job_view import job_view
from services.artifacts import open_store
from services.jobdb import jobs, metrics, tokens
from services.jobdb.events import list_events
from services.jobdb.tracker_runs import runs_of
from services.settings import Settings
from services.worker.trackers.base import FinalCheckpoint, RunIdentity
from services.worker.trackers.callback import TrackerCallback
from services.worker.trackers.handover import TrackerHost
from services.worker.trackers.sink import TrackerSink, ensure_row
from services.worker.trackers.tensorboard_tracker import TensorBoardTracker

IDENTITY = RunIdentity(job_id="j", name="j", owner="o", queue="q", params={})


def never_started_sink(tmp_path: Path) -> TrackerSink:
    """A sink that is never started: the test plays its thread's part (``_take``)."""
    tracker = TensorBoardTracker(open_store(tmp_path.as_uri()), tmp_path, "")
    return TrackerSink(tracker, sessionmaker(), IDENTITY, attempt=1, flush_every_s=60)


def handed_over(host: TrackerHost, s: TrackerSink) -> None:
    """What the host process's main thread does with a batch (``host.host_main``)."""
    raw, commands = host.take()
    for metrics_ in raw:
        s.push(metrics_)
    for command, *args in commands:
        getattr(s, command)(*args)


def taken(s: TrackerSink) -> list[tuple[int, dict[str, float]]]:
    return [(p.step, p.values) for p in s._waiting]


def test_a_step_is_taken_whole_once_a_later_step_started(tmp_path: Path) -> None:
    s = never_started_sink(tmp_path)
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


# --- a real sink thread, a recorded client, accum's store on both backends ----------------

SPEC = {**TINY_SPEC, "max_steps": 12, "trackers": ["mlflow"]}


def trained(steps: range, attempt: int = 1) -> list[dict[str, Any]]:
    """The metrics dicts a training attempt hands over, as the trainer builds them: each step's,
    an evaluation every 4 steps, the exactness check's point (step 0) after the first step."""
    raw: list[dict[str, Any]] = []
    for step in steps:
        raw.append({"step": float(step), "epoch": 0.0, "loss": 1 / (step + 1), "lr": 0.05,
                    "step_time_s": 0.01 * attempt})
        if step == steps[0]:
            raw.append({"step": 0.0, "exactness_rel_error": 1e-9})
        if step % 4 == 0:
            raw.append({"step": float(step), "epoch": 0.0, "val_loss": 2 / (step + 1), "flag": True})
    return raw


def stored_as(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same points as accum's metrics store's rows (what the worker's store callback writes)."""
    return [{"name": k, "step": int(m["step"]), "value": float(v)} for m in raw for k, v in m.items()
            if k not in ("step", "epoch") and type(v) in (float, int)]


def by_name(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """name -> (step, value) by step, as the tracker should have them."""
    out: dict[str, dict[int, float]] = {}
    for row in rows:
        out.setdefault(row["name"], {})[row["step"]] = row["value"]
    return {name: sorted(points.items()) for name, points in out.items()}


def a_job(sessions: sessionmaker[Session]) -> tuple[str, str]:
    with sessions.begin() as session:
        owner, _ = tokens.create_owner_with_token(session, f"u-{uuid.uuid4().hex[:8]}")
        job, _ = jobs.create_job(session, owner=owner, spec=SPEC, queue="q")
        return job.id, owner.name


def store(sessions: sessionmaker[Session], job_id: str, attempt: int, rows: list[dict[str, Any]]) -> None:
    with sessions.begin() as session:
        metrics.write_metrics(session, job_id, attempt, rows)


def event_kinds(sessions: sessionmaker[Session], job_id: str) -> list[str]:
    with sessions() as session:
        return [e.kind for e in list_events(session, job_id, limit=1000)]


def the_row(sessions: sessionmaker[Session], job_id: str) -> Any:
    with sessions() as session:
        [run] = runs_of(session, job_id)
        return run


@pytest.mark.parametrize("buffer_max_steps", [100_000, 10], ids=["buffered", "past-the-buffer"])
def test_a_tracker_down_for_the_whole_attempt_gets_every_step_once_when_back(
    session_factory: sessionmaker[Session], buffer_max_steps: int
) -> None:
    """With a bound of 10 steps the job's 13 (0 to 12) do not fit: the oldest are let go and
    read back from accum's metrics store once the tracker is back, every step still once."""
    sessions = session_factory
    job_id, owner = a_job(sessions)
    raw = trained(range(1, 13))
    store(sessions, job_id, 1, stored_as(raw))
    ensure_row(sessions, job_id, "mlflow")
    tracker = RecordedTracker(down=True)
    identity = RunIdentity(job_id=job_id, name="digits", owner=owner, queue="q", params={"max_steps": "12"})
    sink = TrackerSink(tracker, sessions, identity, attempt=1, flush_every_s=0.02,
                       max_buffered_steps=buffer_max_steps)
    sink.start()
    sink.tag("accum.exactness", "exact")
    for metrics_ in raw:
        sink.push(metrics_)
    checkpoint = FinalCheckpoint(12, f"file:///artifacts/{job_id}/12.pt", None)
    sink.end("succeeded", checkpoint)  # the attempt is over; the tracker is still down

    until(lambda: "tracker_undelivered" in event_kinds(sessions, job_id), "the tracker_undelivered event")
    row = the_row(sessions, job_id)
    assert row.delivered_step == -1 and row.undelivered.startswith("ConnectionError")
    assert undelivered_message(sessions, job_id).startswith("mlflow server unreachable (no answer): ")
    refused = tracker.refused
    until(lambda: tracker.refused > refused, "a retry a period later")
    assert not sink.done.is_set() and tracker.calls == []

    tracker.up()
    assert sink.done.wait(60), "nothing delivered once the tracker was back"
    assert tracker.identity == identity  # the run named, tagged and with the spec's parameters
    assert tracker.points() == by_name(stored_as(raw))  # every step once, in order, every value
    assert tracker.tags == {"accum.exactness": "exact"}
    assert tracker.ended == ("succeeded", checkpoint) and tracker.calls[-2:] == ["finish", "close"]
    row = the_row(sessions, job_id)
    assert (row.delivered_step, row.undelivered) == (12, None)
    assert (row.run_id, row.url) == (tracker.run_id, tracker.url)
    kinds = event_kinds(sessions, job_id)
    assert kinds.count("tracker_undelivered") == 1 and kinds.count("tracker_delivered") == 1
    with sessions() as session:  # what GET /v1/jobs/{id} and the dashboard show
        view = job_view(session, jobs.load_job(session, job_id), owner)
    [link] = view.trackers or []
    assert (link.tracker, link.run_id, link.url) == ("mlflow", tracker.run_id, tracker.url)


@pytest.mark.parametrize("held", [6, None], ids=["the-trackers-account", "the-rows-account"])
def test_a_resumed_attempt_sends_each_step_once(
    session_factory: sessionmaker[Session], held: int | None
) -> None:
    """Attempt 1 trained steps 1-10 and was killed; the row says step 4 was delivered, the
    tracker (MLflow's history, W&B's run files) holds up to 6: a batch sent that the dead
    attempt did not live to record. Attempt 2 resumes from the checkpoint of step 8."""
    sessions = session_factory
    job_id, owner = a_job(sessions)
    first = trained(range(1, 11))
    store(sessions, job_id, 1, stored_as(first))
    second = trained(range(9, 13), attempt=2)
    store(sessions, job_id, 2, stored_as(second))  # the store keeps the newest value of a step
    ensure_row(sessions, job_id, "mlflow")
    tracker = RecordedTracker(held=held)
    identity = RunIdentity(job_id=job_id, name="digits", owner=owner, queue="q", params={},
                           run_id="run-1", delivered_step=4, resume_step=8)
    sink = TrackerSink(tracker, sessions, identity, attempt=2, flush_every_s=0.02)
    sink.start()
    for metrics_ in second:
        sink.push(metrics_)
    sink.end("succeeded", None)
    assert sink.done.wait(60), "the resumed attempt's points were not delivered"
    after = 4 if held is None else held
    want = {name: [(step, value) for step, value in points if step > after]
            for name, points in by_name(stored_as(first) + stored_as(second)).items()}
    assert tracker.points() == {name: points for name, points in want.items() if points}
    assert (the_row(sessions, job_id).delivered_step, tracker.ended) == (12, ("succeeded", None))


def undelivered_message(sessions: sessionmaker[Session], job_id: str) -> str:
    with sessions() as session:
        return next(e.message for e in list_events(session, job_id, limit=100)
                    if e.kind == "tracker_undelivered")


def test_a_client_missing_on_the_worker_is_said_as_such_not_as_a_server_down(
    session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real MLflow tracker on a worker without MLflow's client (its import fails, as where
    `accum[trackers]` is not installed): the event names the install, not a server."""
    from services.worker.trackers.mlflow_tracker import MlflowTracker

    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # `import` raises ImportError
    sessions = session_factory
    job_id, owner = a_job(sessions)
    ensure_row(sessions, job_id, "mlflow")
    identity = RunIdentity(job_id=job_id, name="digits", owner=owner, queue="q", params={})
    sink = TrackerSink(MlflowTracker("http://127.0.0.1:9", "accum", None), sessions, identity,
                       attempt=1, flush_every_s=3600)  # no retry within the test
    sink.start()
    until(lambda: "tracker_undelivered" in event_kinds(sessions, job_id), "the tracker_undelivered event")
    message = undelivered_message(sessions, job_id)
    assert message.startswith("mlflow client not installed on the worker: ")
    assert message.endswith("(install it there: pip install 'accum[trackers]')")
    assert "unreachable" not in message and "refused" not in message


def test_a_runs_parameters_hold_the_effective_batch_as_a_number() -> None:
    """MLflow's and W&B's params logged `effective_batch_size: None` for a batch given as m x N."""
    from services.spec import parse_spec
    from services.worker.trackers.job import run_params

    assert run_params(parse_spec(TINY_SPEC))["effective_batch_size"] == "32"  # 16 x 2 x CPU
    auto = {**TINY_SPEC, "micro_batch_size": "auto", "accumulation_steps": None, "effective_batch_size": 64}
    assert run_params(parse_spec(auto))["effective_batch_size"] == "64"
