"""Trainer callbacks that write a job's progress to the store.

Metrics are buffered and written in one transaction per batch of steps or per second,
whichever comes first (plus at checkpoints and at the end), so per-step logging costs well
under 1% of a step. A checkpoint's row is written in the same transaction as every metric up
to its step: a resumed attempt, which starts from the latest checkpoint row, never finds a
hole in the metrics before it. Retention (last ``keep`` + best by val_loss) runs after each
checkpoint and each evaluation.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from accumcore import Callback, CheckpointInfo
from services.store.checkpoints import (
    add_checkpoint,
    checkpoints_to_prune,
    delete_checkpoint_rows,
    get_checkpoint,
)
from services.store.events import add_event
from services.store.leases import update_progress
from services.store.metrics import metric_rows, write_metrics
from services.worker.heartbeat import Heartbeat

log = logging.getLogger(__name__)

FLUSH_EVERY_STEPS = 200
FLUSH_EVERY_S = 1.0
STEP_KEYS = ("loss", "lr", "grad_norm", "samples_per_s", "items_per_s", "step_time_s")


class StoreCallback(Callback):
    """Streams one attempt's metrics, checkpoints and events into the job store.

    Args:
        sessions: session factory of the store.
        job_id, attempt, worker_id: the attempt; every write is tagged with ``attempt`` and
            progress writes only happen while ``worker_id`` holds the lease.
        total_steps: optimizer steps of the whole run (for ``progress``).
        keep_checkpoints: retention count (the best by val_loss is kept on top of these).
        heartbeat: its flags answer ``should_stop`` (cancel requested, lease lost).
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        job_id: str,
        attempt: int,
        worker_id: str,
        total_steps: int,
        keep_checkpoints: int,
        heartbeat: Heartbeat | None = None,
        flush_every_steps: int = FLUSH_EVERY_STEPS,
        flush_every_s: float = FLUSH_EVERY_S,
    ) -> None:
        self.sessions = sessions
        self.job_id, self.attempt, self.worker_id = job_id, attempt, worker_id
        self.total_steps = total_steps
        self.keep_checkpoints = keep_checkpoints
        self.heartbeat = heartbeat
        self.flush_every_steps, self.flush_every_s = flush_every_steps, flush_every_s
        self._rows: list[dict[str, Any]] = []
        self._steps_buffered = 0
        self._last_flush = time.monotonic()
        self._progress: dict[str, Any] = {}
        self._latest: dict[str, Any] = {}
        self._last_eval: dict[str, float] = {}
        self.flushes = 0

    # ------------------------------------------------------------------ trainer hooks
    def should_stop(self) -> bool:
        return self.heartbeat is not None and self.heartbeat.should_stop()

    def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        step, epoch = int(metrics["step"]), int(metrics["epoch"])
        self._rows.extend(metric_rows(step, epoch, metrics))
        self._steps_buffered += 1
        self._progress = {"epoch": epoch, "optimizer_step": step, "total_optimizer_steps": self.total_steps}
        self._latest.update({k: v for k, v in metrics.items() if k not in ("epoch",)})
        if (
            self._steps_buffered >= self.flush_every_steps
            or time.monotonic() - self._last_flush >= self.flush_every_s
        ):
            self.flush()

    def on_eval(self, trainer: Any, metrics: dict[str, float]) -> None:
        step, epoch = int(metrics["step"]), int(metrics["epoch"])
        self._rows.extend(metric_rows(step, epoch, metrics))
        self._last_eval = dict(metrics)
        self._latest.update({k: v for k, v in metrics.items() if k not in ("step", "epoch")})
        with self.sessions.begin() as session:
            self._write_buffer(session)
            # The checkpoint at this step (written just before the eval) now has its val_loss.
            checkpoint = get_checkpoint(session, self.job_id, step)
            if checkpoint is not None:
                self._record_checkpoint(session, checkpoint.uri, step, checkpoint.epoch,
                                        checkpoint.size_bytes, checkpoint.sha256, checkpoint.metrics)
                self._prune(session)

    def on_checkpoint(self, trainer: Any, info: CheckpointInfo) -> None:
        with self.sessions.begin() as session:
            self._write_buffer(session)
            self._record_checkpoint(session, str(info.path), info.step, info.epoch,
                                    info.size_bytes, info.sha256, info.metrics)
            add_event(session, self.job_id, "checkpoint", f"checkpoint at step {info.step}",
                      {"step": info.step, "size_bytes": info.size_bytes, "sha256": info.sha256},
                      attempt=self.attempt)
            self._prune(session)

    def on_event(self, trainer: Any, kind: str, message: str, data: dict[str, Any]) -> None:
        with self.sessions.begin() as session:
            add_event(session, self.job_id, kind, message, dict(data), attempt=self.attempt)

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        self.flush()

    # ---------------------------------------------------------------------- writing
    def flush(self) -> None:
        """Write buffered metrics and progress in one transaction."""
        if not self._rows and not self._progress:
            return
        with self.sessions.begin() as session:
            self._write_buffer(session)

    def _write_buffer(self, session: Session) -> None:
        if self._rows:
            write_metrics(session, self.job_id, self.attempt, self._rows)
        if self._progress or self._latest:
            update_progress(session, self.job_id, self._progress or None, self._latest or None,
                            worker_id=self.worker_id)
        self._rows, self._steps_buffered = [], 0
        self._last_flush = time.monotonic()
        self.flushes += 1

    def _record_checkpoint(self, session: Session, uri: str, step: int, epoch: int | None,
                           size_bytes: int, sha256: str, metrics: dict[str, Any]) -> None:
        merged = dict(metrics or {})
        if self._last_eval and int(self._last_eval.get("step", -1)) == step:
            merged.update({k: v for k, v in self._last_eval.items() if k not in ("step", "epoch")})
        add_checkpoint(session, self.job_id, step, uri, size_bytes, sha256, epoch=epoch,
                       metrics=merged, attempt=self.attempt)

    def _prune(self, session: Session) -> None:
        doomed = checkpoints_to_prune(session, self.job_id, self.keep_checkpoints)
        for checkpoint in doomed:
            Path(checkpoint.uri).unlink(missing_ok=True)
        delete_checkpoint_rows(session, self.job_id, [c.step for c in doomed])
