"""Trainer callbacks that write a job's progress to the store.

Metrics are buffered by the training thread (a list append per step) and written by a
background writer thread in one transaction per batch of steps or per second, whichever
comes first, so neither the cost of a transaction nor a slow database (a SQLite write lock
held by the API, a PostgreSQL hiccup) ever stalls training. A checkpoint's row is written,
synchronously, in the same transaction as every metric up to its step: a resumed attempt,
which starts from the latest checkpoint row, never finds a hole in the metrics before it.
Retention (last ``keep`` + best by val_loss) runs after each checkpoint and each evaluation.
A database outage (PostgreSQL restarting) loses nothing: the writer thread keeps the rows and
tries again, and synchronous writes (checkpoint rows, events, the last flush) are retried
(``db_retry``) for up to a lease timeout; rows are keyed by (job, name, step), so a batch
written twice is still one row per step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
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
from services.store.nonfinite import json_safe
from services.worker.checkpoints import remove_files
from services.worker.db_retry import retry_while_unreachable
from services.worker.heartbeat import Heartbeat

log = logging.getLogger(__name__)

FLUSH_EVERY_STEPS = 200
FLUSH_EVERY_S = 1.0
# How long synchronous writes wait out a database outage when the caller gives neither a
# heartbeat nor retry_for_s (tests): the default lease timeout.
RETRY_WRITES_FOR_S = 60.0


class StoreCallback(Callback):
    """Streams one attempt's metrics, checkpoints and events into the job store.

    Args:
        sessions: session factory of the store.
        job_id, attempt, worker_id: the attempt; every write is tagged with ``attempt`` and
            progress writes only happen while ``worker_id`` holds the lease.
        total_steps: optimizer steps of the whole run (for ``progress``).
        keep_checkpoints: retention count (the best by val_loss is kept on top of these).
        heartbeat: its flags answer ``should_stop`` (cancel requested, lease lost).
        retry_for_s: how long synchronous writes wait out a database outage (default: the
            heartbeat's lease timeout; past it, another worker may own the job).
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
        retry_for_s: float | None = None,
    ) -> None:
        self.sessions = sessions
        self.job_id, self.attempt, self.worker_id = job_id, attempt, worker_id
        self.total_steps = total_steps
        self.keep_checkpoints = keep_checkpoints
        self.heartbeat = heartbeat
        self.flush_every_steps, self.flush_every_s = flush_every_steps, flush_every_s
        self._rows: list[dict[str, Any]] = []
        self._steps_buffered = 0
        self._progress: dict[str, Any] = {}
        self._latest: dict[str, Any] = {}
        self._last_eval: dict[str, float] = {}
        self._checkpoint_steps: set[int] = set()
        self._pruned: list[Path] = []  # files of the rows the current write prunes
        # Held from taking the buffer until its transaction commits, by the writer thread and
        # by synchronous writes (checkpoints) alike: metrics reach the database in step order.
        self._write_lock = threading.Lock()
        self._buffer_lock = threading.Lock()
        self._inflight: tuple[list[dict[str, Any]], dict[str, Any]] = ([], {})
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._writer: threading.Thread | None = None
        self.flushes = 0
        if retry_for_s is None:
            retry_for_s = heartbeat.lease_timeout_s if heartbeat is not None else RETRY_WRITES_FOR_S
        self.retry_for_s = retry_for_s
        # (step, epoch) of the latest optimizer step: a checkpoint's row gets the 0-based epoch
        # its step belongs to, as metrics do. The trainer's own progress counter has already
        # moved on to the next epoch when it saves at an epoch's end (that is where a resume
        # starts, and what the file keeps).
        self._last_step_epoch: tuple[int, int] | None = None

    # ------------------------------------------------------------------ trainer hooks
    def should_stop(self) -> bool:
        return self.heartbeat is not None and self.heartbeat.should_stop()

    def on_fit_start(self, trainer: Any) -> None:
        self._stopped.clear()
        self._writer = threading.Thread(target=self._write_loop, name="accum-metrics", daemon=True)
        self._writer.start()

    def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        step, epoch = int(metrics["step"]), int(metrics["epoch"])
        self._last_step_epoch = (step, epoch)
        rows = metric_rows(step, epoch, metrics)
        progress = {"epoch": epoch, "optimizer_step": step, "total_optimizer_steps": self.total_steps}
        with self._buffer_lock:  # uncontended but for the writer's swap: ~100 ns
            self._rows.extend(rows)
            self._progress = progress
            self._latest.update({k: v for k, v in metrics.items() if k != "epoch"})
            self._steps_buffered += 1
            full = self._steps_buffered >= self.flush_every_steps
        if full:
            self._wake.set()

    def on_eval(self, trainer: Any, metrics: dict[str, float]) -> None:
        step, epoch = int(metrics["step"]), int(metrics["epoch"])
        with self._buffer_lock:
            self._rows.extend(metric_rows(step, epoch, metrics))
            self._latest.update({k: v for k, v in metrics.items() if k not in ("step", "epoch")})
        self._last_eval = dict(metrics)
        if step not in self._checkpoint_steps:
            return  # the writer thread takes the rows with the next batch

        def write(session: Session) -> None:
            self._write_buffer(session)
            # The checkpoint at this step (written just before the eval) now has its val_loss.
            checkpoint = get_checkpoint(session, self.job_id, step)
            if checkpoint is not None:
                self._record_checkpoint(session, checkpoint.uri, step, checkpoint.epoch,
                                        checkpoint.size_bytes, checkpoint.sha256, checkpoint.metrics)
                self._prune(session)

        self._write_retrying(write, f"evaluation at step {step}")

    def on_checkpoint(self, trainer: Any, info: CheckpointInfo) -> None:
        self._checkpoint_steps.add(info.step)

        def write(session: Session) -> None:
            self._write_buffer(session)
            self._record_checkpoint(session, str(info.path), info.step, self._epoch_of(info),
                                    info.size_bytes, info.sha256, info.metrics)
            add_event(session, self.job_id, "checkpoint", f"checkpoint at step {info.step}",
                      {"step": info.step, "size_bytes": info.size_bytes, "sha256": info.sha256},
                      attempt=self.attempt)
            self._prune(session)

        self._write_retrying(write, f"checkpoint at step {info.step}")

    def _epoch_of(self, info: CheckpointInfo) -> int:
        """The 0-based epoch of the checkpoint's step (the epoch its metrics carry)."""
        if self._last_step_epoch is not None and self._last_step_epoch[0] == info.step:
            return self._last_step_epoch[1]
        return info.epoch

    def on_event(self, trainer: Any, kind: str, message: str, data: dict[str, Any]) -> None:
        if kind == "exactness_check":
            # The check's figure as a metric at step 0 (before the first optimizer step), and
            # the event's data JSON-safe (an infinite error as its label).
            if isinstance(data.get("rel_error"), float):
                with self._buffer_lock:
                    self._rows.extend(metric_rows(0, 0, {"exactness_rel_error": data["rel_error"]}))
            data = json_safe(data)

        def write() -> None:
            with self.sessions.begin() as session:
                add_event(session, self.job_id, kind, message, dict(data), attempt=self.attempt)

        self._retrying(write, f"{kind} event")

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        self.close()

    # ---------------------------------------------------------------------- writing
    def close(self) -> None:
        """Stop the writer thread and write what is left (also called if fit raises)."""
        self._stopped.set()
        self._wake.set()
        if self._writer is not None and self._writer is not threading.current_thread():
            self._writer.join(timeout=60)
        self._writer = None
        self._write_retrying(self._write_buffer, "last metrics")

    def flush(self) -> None:
        """Write buffered metrics and progress in one transaction, now. On failure the rows
        stay buffered for the next try."""
        self._transaction(self._write_buffer)

    def _transaction(self, write: Callable[[Session], None]) -> None:
        """``write`` in one transaction under the write lock; the metric rows it took from
        the buffer go back there if the transaction fails."""
        with self._write_lock:
            try:
                with self.sessions.begin() as session:
                    write(session)
            except Exception:
                self._restore_inflight()
                raise
            self._inflight = ([], {})

    def _write_retrying(self, write: Callable[[Session], None], what: str) -> None:
        self._pruned = []
        self._retrying(lambda: self._transaction(write), what)
        # Pruned files go only once their rows' deletion committed: a crash in between leaves
        # a file no row lists (the next attempt removes it), never a row without its file.
        remove_files(self._pruned)

    def _retrying(self, write: Callable[[], None], what: str) -> None:
        def lease_lost() -> bool:
            return self.heartbeat is not None and self.heartbeat.lease_lost

        retry_while_unreachable(write, what=f"job {self.job_id}: {what}", for_s=self.retry_for_s,
                                give_up=lease_lost)

    def _write_loop(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.flush_every_s)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                self.flush()
            except Exception:  # keep the rows (they are put back) and try again next time
                log.warning("writing metrics of job %s failed; retrying", self.job_id, exc_info=True)

    def _write_buffer(self, session: Session) -> None:
        """Take the buffer and write it in ``session``; callers hold ``_write_lock``."""
        with self._buffer_lock:
            rows, self._rows = self._rows, []
            progress, self._progress = self._progress, {}
            latest = dict(self._latest)
            self._steps_buffered = 0
        self._inflight = (rows, progress)
        if rows:
            write_metrics(session, self.job_id, self.attempt, rows)
        if progress or latest:
            update_progress(session, self.job_id, progress or None, latest or None,
                            worker_id=self.worker_id)
        self.flushes += 1

    def _restore_inflight(self) -> None:
        rows, progress = self._inflight
        with self._buffer_lock:
            self._rows[:0] = rows
            self._progress = self._progress or progress
        self._inflight = ([], {})

    def _record_checkpoint(self, session: Session, uri: str, step: int, epoch: int | None,
                           size_bytes: int, sha256: str, metrics: dict[str, Any]) -> None:
        merged = dict(metrics or {})
        if self._last_eval and int(self._last_eval.get("step", -1)) == step:
            merged.update({k: v for k, v in self._last_eval.items() if k not in ("step", "epoch")})
        add_checkpoint(session, self.job_id, step, uri, size_bytes, sha256, epoch=epoch,
                       metrics=merged, attempt=self.attempt)

    def _prune(self, session: Session) -> None:
        """Delete the rows of checkpoints past retention; ``_write_retrying`` deletes their
        files after the commit."""
        doomed = checkpoints_to_prune(session, self.job_id, self.keep_checkpoints)
        delete_checkpoint_rows(session, self.job_id, [c.step for c in doomed])
        self._pruned = [Path(c.uri) for c in doomed]
