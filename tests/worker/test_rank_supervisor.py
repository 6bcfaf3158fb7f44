"""The worker that supervises a job's spawned ranks (``services.worker.distributed``).

A hung rank of a ``gpus: 2`` job, through real spawned gloo ranks: one rank SIGSTOPped mid-job
(held at a known step: tests/held_jobs.py) is caught by the worker that supervises the ranks
(``services.worker.pulse``: its beats stop; its peer's collective times out waiting for it)
within ACCUM_COLLECTIVE_TIMEOUT_S + 10 s; the attempt closes ``hung`` with an event naming
the node, the rank and its pid; the job resumes from its last checkpoint and trains each step
once. And a cancelled or timed-out ``gpus: 2`` job ends its tracker's run ``cancelled`` or
``failed`` (the supervisor's stop says why; its spawned rank 0 ends the run by it)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from held_jobs import GATE_VARIABLE, Hold, plugin_on_path

from services.jobdb import checkpoints, jobs, metrics
from services.jobdb.events import list_events
from services.jobdb.models import JobAttempt
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker.runner import run_job

COLLECTIVE_TIMEOUT_S = 10.0  # the peer's collective fails after it; the pulse deadline 5 s later
STEPS, HOLD_STEP, CHECKPOINT = 8, 4, 3
SPEC = {"model": "mlp", "dataset": Hold.dataset(HOLD_STEP, micro_batches=2), "micro_batch_size": 16,
        "accumulation_steps": 2, "max_steps": STEPS, "checkpoint_every": CHECKPOINT,
        "keep_checkpoints": 2, "optimizer": {"name": "sgd", "lr": 0.1}, "gpus": 2, "max_restarts": 2}


def held(settings: Settings, hold: Hold, job_id: str) -> None:
    """Until both ranks wait at the gate after step HOLD_STEP, past the checkpoint at CHECKPOINT."""
    deadline = time.monotonic() + 180
    while True:
        with session_factory(settings)() as session:
            job = jobs.load_job(session, job_id)
            kept = [c.step for c in checkpoints.list_checkpoints(session, job_id)]
        assert job is not None and job.status in ("queued", "running"), (job and job.error)
        if len(hold.held()) >= 2 and CHECKPOINT in kept:
            return
        assert time.monotonic() < deadline, (hold.held(), kept)
        time.sleep(0.05)


@pytest.mark.slow
def test_a_stopped_rank_of_a_gpus_2_job_ends_the_attempt_and_the_job_resumes(
    settings: Settings, make_job: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = settings.model_copy(update={"collective_timeout_s": COLLECTIVE_TIMEOUT_S})
    hold = Hold(tmp_path / "gate")
    monkeypatch.setenv(GATE_VARIABLE, str(hold.gate))  # the spawned ranks inherit it, and the path
    stopped: list[int] = []
    try:
        with plugin_on_path():
            hold.gate.touch()
            job_id = make_job(SPEC)
            outcome: list[str] = []
            first = threading.Thread(target=lambda: outcome.append(run_job(settings, job_id, "w")))
            first.start()
            held(settings, hold, job_id)
            stopped.append(hold.held()[0])
            os.kill(stopped[0], signal.SIGSTOP)
            at = time.monotonic()
            hold.release()  # the other rank trains on into the collective the stopped one never joins
            first.join(timeout=COLLECTIVE_TIMEOUT_S * 2 + 60)
            noticed_s = time.monotonic() - at
            assert outcome == ["handed_back"], outcome
            assert noticed_s <= COLLECTIVE_TIMEOUT_S + 10, noticed_s
            assert run_job(settings, job_id, "w") == "succeeded"  # its next attempt: from step 3
        with session_factory(settings)() as session:
            job = jobs.load_job(session, job_id)
            events = list_events(session, job_id)
            first_attempt = session.query(JobAttempt).filter_by(job_id=job_id, attempt=1).one()
            rows, _ = metrics.read_metrics(session, job_id, name="loss", limit=1000)
        assert job is not None and job.status == "succeeded" and job.restarts == 1
        assert first_attempt.outcome == "hung" and first_attempt.ended_at is not None
        [lost] = [e for e in events if e.kind == "hung"]
        assert lost.message.startswith("node 0 of 1: rank "), lost.message
        assert f"(pid {stopped[0]}," in lost.message and "hung" in lost.message, lost.message
        assert [r.step for r in rows] == list(range(1, STEPS + 1))  # each step once
    finally:
        hold.release()
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def tensorboard_status(settings: Settings, job_id: str) -> list[bytes]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(settings.artifacts_path / "tensorboard" / job_id),
                              size_guidance={"tensors": 0})
    events.Reload()
    return [s for e in events.Tensors("accum/status/text_summary") for s in e.tensor_proto.string_val]


@pytest.mark.slow
@pytest.mark.parametrize(("end", "status"), [("cancel", b"cancelled"), ("timeout", b"failed")])
def test_a_stopped_gpus_2_job_ends_its_trackers_run_with_its_status(
    settings: Settings, make_job: Callable[..., str], end: str, status: bytes,
) -> None:
    # A lease timeout (the ranks' grace to stop) long enough for them to start: the timeout
    # stops them at their first window, their trackers open.
    tracked = settings.model_copy(update={"trackers": ["tensorboard"], "tracker_flush_every_s": 0.2,
                                          "lease_timeout_s": 60})
    spec = {"model": "mlp", "dataset": "digits", "micro_batch_size": 64, "accumulation_steps": 2,
            "max_steps": 100_000, "checkpoint_every": 100_000, "gpus": 2,
            "optimizer": {"name": "sgd", "lr": 0.1}, "trackers": ["tensorboard"]}
    if end == "timeout":  # past it before the ranks have started: they stop at their first window
        job_id = make_job({**spec, "timeout": 1})
        assert run_job(tracked, job_id, "w") == "failed"
    else:
        job_id = make_job(spec)
        outcome: list[str] = []
        runner = threading.Thread(target=lambda: outcome.append(run_job(tracked, job_id, "w")))
        runner.start()
        sessions = session_factory(tracked)
        deadline = time.monotonic() + 180
        while True:
            with sessions() as session:
                job = jobs.load_job(session, job_id)
            assert job is not None and job.status in ("queued", "running"), (job and job.error)
            if (job.progress or {}).get("optimizer_step", 0) > 0:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with sessions.begin() as session:
            jobs.request_cancel(session, jobs.load_job(session, job_id))
        runner.join(timeout=180)
        assert outcome == ["cancelled"]
    assert tensorboard_status(tracked, job_id) == [status]  # was: the run left open
