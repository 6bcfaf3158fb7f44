"""An attempt's tracker callback outside a training job, for the tracker-host tests
(test_trackers_host.py, test_shared_tracker_host.py): built by ``job_trackers`` as the worker
builds it, its host started as a fit's start does, then fed steps by hand."""

from __future__ import annotations

from typing import Any

from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.spec import parse_spec
from services.worker.attempt import Attempt
from services.worker.checkpoints.resume import checkpoint_uploads
from services.worker.trackers.callback import TrackerCallback
from services.worker.trackers.job import job_trackers


def tracked(settings: Settings, job_id: str, spec_data: dict[str, Any], *, flush_every_s: float,
            end_wait_s: float) -> TrackerCallback:
    """The TensorBoard tracker callback of attempt 1 of ``job_id``; an attempt's end waits up to
    ``end_wait_s`` for the host."""
    settings = settings.model_copy(update={"trackers": ["tensorboard"], "tracker_flush_every_s": flush_every_s,
                                           "tracker_end_wait_s": end_wait_s})
    spec = parse_spec(spec_data)
    attempt = Attempt(job_id, 1, "node-a", None, spec.normalised())
    callback = job_trackers(settings, session_factory(settings), attempt, spec,
                            checkpoint_uploads(settings, attempt, None))
    assert callback is not None
    callback.on_fit_start(None)
    return callback


def send_steps(callback: TrackerCallback, last: int) -> None:
    """Steps 1..``last`` with a loss of 1/step, as a training loop reports them."""
    for step in range(1, last + 1):
        callback.on_step(None, {"step": float(step), "epoch": 0.0, "loss": 1 / step})
