"""The trainer callback that hands a job's progress to its trackers, through the tracker host.

The training thread does as little as it can: each step's and each evaluation's metrics dict
(the trainer builds a fresh one each time and never changes it) is appended, by reference, to
one list (``handover.TrackerHost.push``, ~0.2 us), which a light thread hands over to the host
process a flush period at a time. Grouping into steps, filtering and encoding happen in the
host, on its sinks' threads; a step is delivered once complete (a later step has started or
the attempt ended), so an evaluation at that step travels with it and a step is never
delivered in two halves (a resumed attempt skips whole steps the tracker already has).
"""

from __future__ import annotations

from typing import Any

from accumcore import Callback, CheckpointInfo
from services.artifacts import checkpoint_key, manifest_key
from services.worker.checkpoints.uploads import CheckpointUploads
from services.worker.trackers.base import FinalCheckpoint
from services.worker.trackers.handover import TrackerHost


class TrackerCallback(Callback):
    def __init__(self, host: TrackerHost, uploads: CheckpointUploads, end_wait_s: float) -> None:
        self.host, self.uploads, self.end_wait_s = host, uploads, end_wait_s
        self._checkpoint: CheckpointInfo | None = None
        self._started = False

    def start(self) -> None:
        """Start the host process (``job.job_trackers`` does, as the attempt begins: its
        start-up, ~3 s of imports, overlaps building the run); its runs open at once."""
        if not self._started:
            self._started = True
            self.host.start()

    def on_fit_start(self, trainer: Any) -> None:
        self.start()

    def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        self.host.push(metrics)

    def on_eval(self, trainer: Any, metrics: dict[str, float]) -> None:
        self.host.push(metrics)

    def on_event(self, trainer: Any, kind: str, message: str, data: dict[str, Any]) -> None:
        if kind != "exactness_check":
            return
        passed = data.get("passed")
        verdict = "exact" if passed is True else "inexact" if passed is False else "not checked"
        self.host.tag("accum.exactness", verdict)
        if isinstance(data.get("rel_error"), float):  # as the store records it: step 0
            self.host.push({"step": 0.0, "exactness_rel_error": data["rel_error"]})

    def on_checkpoint(self, trainer: Any, info: CheckpointInfo) -> None:
        self._checkpoint = info

    def end(self, status: str | None) -> None:
        """The attempt is over: deliver the last step; ``status`` (succeeded, failed,
        cancelled) ends the runs with the final checkpoint's location, None leaves them open for
        the job's next attempt. Waits up to ``end_wait_s`` for the trackers."""
        if self._started:
            self.host.end(status, self._final() if status else None)
            self.host.wait(self.end_wait_s)

    def _final(self) -> FinalCheckpoint | None:
        info = self._checkpoint
        if info is None:
            return None
        key = (manifest_key if info.path.is_dir() else checkpoint_key)(self.uploads.job_id, info.step)
        local = self.uploads.cache.path_for(key)
        return FinalCheckpoint(info.step, f"{self.uploads.store.url}/{key}",
                               str(local) if local.exists() else None)
