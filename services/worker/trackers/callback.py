"""The trainer callback that hands a job's progress to its trackers' sinks.

A step's points are pushed once the step is complete, i.e. when the next step starts or the
attempt ends, so an evaluation at that step travels with it and a step is never delivered
in two halves (a resumed attempt skips whole steps the tracker already has).
"""

from __future__ import annotations

from typing import Any

from accumcore import Callback, CheckpointInfo
from services.artifacts import checkpoint_key
from services.worker.trackers.base import FinalCheckpoint, StepPoints
from services.worker.trackers.sink import TrackerSink, wait_all
from services.worker.uploads import CheckpointUploads


class TrackerCallback(Callback):
    def __init__(self, sinks: list[TrackerSink], uploads: CheckpointUploads,
                 end_wait_s: float) -> None:
        self.sinks, self.uploads, self.end_wait_s = sinks, uploads, end_wait_s
        self._step: StepPoints | None = None
        self._checkpoint: CheckpointInfo | None = None
        self._started = False

    def on_fit_start(self, trainer: Any) -> None:
        if not self._started:
            self._started = True
            for sink in self.sinks:
                sink.start()

    def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        self._push()
        self._step = StepPoints(int(metrics["step"]), _numbers(metrics))

    def on_eval(self, trainer: Any, metrics: dict[str, float]) -> None:
        step = int(metrics["step"])
        if self._step is None or self._step.step != step:
            self._push()
            self._step = StepPoints(step)
        self._step.values.update(_numbers(metrics))

    def on_event(self, trainer: Any, kind: str, message: str, data: dict[str, Any]) -> None:
        if kind != "exactness_check":
            return
        passed = data.get("passed")
        verdict = "exact" if passed is True else "inexact" if passed is False else "not checked"
        for sink in self.sinks:
            sink.tag("accum.exactness", verdict)
        if isinstance(data.get("rel_error"), float):  # as the store records it: step 0
            for sink in self.sinks:
                sink.push(StepPoints(0, {"exactness_rel_error": data["rel_error"]}))

    def on_checkpoint(self, trainer: Any, info: CheckpointInfo) -> None:
        self._checkpoint = info

    def end(self, status: str | None) -> None:
        """The attempt is over: deliver the last step; ``status`` (succeeded, failed,
        cancelled) ends the runs with the final checkpoint's location, None leaves them open for
        the job's next attempt. Waits up to ``end_wait_s`` for the trackers."""
        self._push()
        final = self._final() if status else None
        for sink in self.sinks:
            sink.end(status, final)
        if self._started:
            wait_all(self.sinks, self.end_wait_s)

    def _final(self) -> FinalCheckpoint | None:
        info = self._checkpoint
        if info is None:
            return None
        key = checkpoint_key(self.uploads.job_id, info.step)
        local = self.uploads.cache.path_for(key)
        return FinalCheckpoint(info.step, f"{self.uploads.store.url}/{key}",
                               str(local) if local.exists() else None)

    def _push(self) -> None:
        if self._step is not None:
            for sink in self.sinks:
                sink.push(self._step)
            self._step = None


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if k not in ("step", "epoch") and isinstance(v, int | float) and not isinstance(v, bool)}
