"""Callback protocol of the trainer, and the record of a written checkpoint.

Torch-free on purpose: the worker's store callbacks subclass ``Callback`` without paying for
anything else. Every method is optional; the defaults do nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint file that was written completely (atomically) to ``path``."""

    path: Path
    step: int
    epoch: int
    size_bytes: int
    sha256: str
    metrics: dict[str, float] = field(default_factory=dict)


class Callback:
    """Hooks called by ``Trainer.fit``. Subclass and override what you need.

    None of them is given device tensors: metrics are plain floats, gathered with at most one
    device sync per optimizer step, so a callback never slows the micro-batch loop down.
    """

    def on_fit_start(self, trainer: Any) -> None:
        """Called once, before the first micro-batch."""

    def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        """Called after every optimizer step (window boundary)."""

    def on_eval(self, trainer: Any, metrics: dict[str, float]) -> None:
        """Called after each evaluation on the validation loader."""

    def on_checkpoint(self, trainer: Any, info: CheckpointInfo) -> None:
        """Called after a checkpoint file has been written and renamed into place."""

    def on_shards(self, trainer: Any, step: int, files: list[Path]) -> None:
        """A sharded (FSDP) checkpoint of ``step`` is whole: called on every rank with the
        files this rank wrote (rank 0's include ``.metadata`` and ``trainer.pt``), before
        ``on_checkpoint`` on rank 0. Where ranks do not share a disk, each rank's files are
        on its own node only."""

    def on_event(self, trainer: Any, kind: str, message: str, data: dict[str, Any]) -> None:
        """Called for notable events: ``oom_backoff``, ``fp16_step_skipped``,
        ``nonfinite_step_skipped``, ``empty_window``, ``batchnorm_warning``, ``resume_inexact``,
        ``exactness_check`` (``Trainer(verify_window=...)``)."""

    def should_stop(self) -> bool:
        """Polled before every micro-batch (under DDP: once per window, and every rank stops
        when one asks); return True to stop within one micro-batch (window)."""
        return False

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        """Called once when ``fit`` returns (also after a stop)."""


class CallbackList:
    """Fans each hook out to every callback, in order."""

    def __init__(self, callbacks: Iterable[Callback]) -> None:
        self.callbacks = list(callbacks)
        for callback in self.callbacks:
            if not isinstance(callback, Callback):
                raise TypeError(
                    f"callbacks must subclass accumcore.Callback, got {type(callback).__name__}; "
                    "write `class MyCallback(accumcore.Callback): ...`"
                )
        # Only callbacks that override should_stop are polled in the micro-batch loop.
        self._stoppers = [
            c for c in self.callbacks if type(c).should_stop is not Callback.should_stop
        ]

    def on_fit_start(self, trainer: Any) -> None:
        for callback in self.callbacks:
            callback.on_fit_start(trainer)

    def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        for callback in self.callbacks:
            callback.on_step(trainer, metrics)

    def on_eval(self, trainer: Any, metrics: dict[str, float]) -> None:
        for callback in self.callbacks:
            callback.on_eval(trainer, metrics)

    def on_checkpoint(self, trainer: Any, info: CheckpointInfo) -> None:
        for callback in self.callbacks:
            callback.on_checkpoint(trainer, info)

    def on_shards(self, trainer: Any, step: int, files: list[Path]) -> None:
        for callback in self.callbacks:
            callback.on_shards(trainer, step, files)

    def on_event(self, trainer: Any, kind: str, message: str, data: dict[str, Any]) -> None:
        for callback in self.callbacks:
            callback.on_event(trainer, kind, message, data)

    @property
    def can_stop(self) -> bool:
        """Whether any callback overrides ``should_stop`` (else the trainer never polls it and
        keeps no stop bookkeeping)."""
        return bool(self._stoppers)

    def should_stop(self) -> bool:
        return any(c.should_stop() for c in self._stoppers)

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        for callback in self.callbacks:
            callback.on_fit_end(trainer, history)
