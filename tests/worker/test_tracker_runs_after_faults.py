"""A job that fails because its restarts ran out after a fault ends its tracker runs ``failed``
(``runner._after_fault``): here both spawned ranks of a ``gpus: 2`` job are killed mid-job
(held at a known step: tests/held_jobs.py), so no rank is left to end the run, and with
``max_restarts: 0`` the job fails at once. Before, its run stayed open for good."""

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

from services.jobdb import jobs
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker.runner import run_job


def tensorboard_status(settings: Settings, job_id: str) -> list[bytes]:
    """The end statuses the job's TensorBoard run recorded (none while it is open)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(settings.artifacts_path / "tensorboard" / job_id), size_guidance={"tensors": 0})
    events.Reload()
    if "accum/status/text_summary" not in events.Tags()["tensors"]:
        return []
    return [s for e in events.Tensors("accum/status/text_summary") for s in e.tensor_proto.string_val]


@pytest.mark.slow
def test_a_job_failed_after_its_ranks_died_ends_its_tracker_run_failed(
    settings: Settings, make_job: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracked = settings.model_copy(update={"trackers": ["tensorboard"], "tracker_flush_every_s": 0.2})
    hold = Hold(tmp_path / "gate")
    monkeypatch.setenv(GATE_VARIABLE, str(hold.gate))  # the spawned ranks inherit it
    spec = {"model": "mlp", "dataset": Hold.dataset(1, micro_batches=1), "micro_batch_size": 16,
            "accumulation_steps": 2, "max_steps": 4, "optimizer": {"name": "sgd", "lr": 0.1},
            "gpus": 2, "trackers": ["tensorboard"]}
    killed: list[int] = []
    try:
        with plugin_on_path():
            hold.gate.touch()
            job_id = make_job(spec)
            with session_factory(tracked).begin() as session:  # as the API stores the spec's
                jobs.load_job(session, job_id).max_restarts = 0
            outcome: list[str] = []
            runner = threading.Thread(target=lambda: outcome.append(run_job(tracked, job_id, "w")))
            runner.start()
            deadline = time.monotonic() + 180
            while len(hold.held()) < 2:
                with session_factory(tracked)() as session:
                    job = jobs.load_job(session, job_id)
                assert job is not None and job.status in ("queued", "running"), (job and job.error)
                assert time.monotonic() < deadline, hold.held()
                time.sleep(0.05)
            for pid in hold.held():  # rank 0 among them: nobody is left to end the run
                killed.append(pid)
                os.kill(pid, signal.SIGKILL)
            runner.join(timeout=120)
        assert outcome == ["failed"], outcome
        with session_factory(tracked)() as session:
            job = jobs.load_job(session, job_id)
        assert job is not None and job.error is not None and job.error["reason"] == "max_restarts", job.error
        assert tensorboard_status(tracked, job_id) == [b"failed"]  # was: [] (the run left open)
    finally:
        hold.release()
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
