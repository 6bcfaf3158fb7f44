"""A hung rank of a ``gpus: 2`` job, through real spawned gloo ranks: one rank SIGSTOPped mid-job
(held at a known step: tests/held_jobs.py) is caught by the worker that supervises the ranks
(``services.worker.pulse``: its beats stop; its peer's collective times out waiting for it)
within ACCUM_COLLECTIVE_TIMEOUT_S + 10 s; the attempt closes ``node_lost`` with an event naming
the node, the rank and its pid; the job resumes from its last checkpoint and trains each step
once. And a cancelled ``gpus: 2`` job ends its tracker's run ``cancelled`` (its spawned rank 0
learns why the supervisor stopped it)."""

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

COLLECTIVE_TIMEOUT_S = 10.0  # the peer's collective fails after it; the pulse deadline is 1.5 x
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
        assert first_attempt.outcome == "node_lost" and first_attempt.ended_at is not None
        [lost] = [e for e in events if e.kind == "node_lost"]
        assert lost.message.startswith("node 0 of 1: rank "), lost.message
        assert f"(pid {stopped[0]}," in lost.message and "hung" in lost.message, lost.message
        assert [r.step for r in rows] == list(range(1, STEPS + 1))  # each step once
    finally:
        hold.release()
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
