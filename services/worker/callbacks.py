"""Trainer callbacks that write a job's progress to the store.

Metrics are buffered by the training thread (a list append per step) and written by a
background writer thread in one transaction per batch of steps or per second, whichever
comes first, so neither the cost of a transaction nor a slow database (a SQLite write lock
held by the API, a PostgreSQL hiccup) ever stalls training. A checkpoint goes to the artifact
store in the background (``uploads``: at most one in flight); its row is written once the
object is complete, in the same transaction as every metric up to its step: a resumed attempt,
which starts from the latest checkpoint row, never finds a hole in the metrics before it.
Retention (last ``keep`` + best by val_loss) runs after each checkpoint and each evaluation.
A database outage (PostgreSQL restarting) loses nothing: the writer thread keeps the rows and
tries again, and synchronous writes (checkpoint rows, events, the last flush) are retried
(``services.worker.retry``) for up to a lease timeout; rows are keyed by (job, name, step), so a batch
written twice is still one row per step.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from accumcore import Callback, CheckpointInfo
from services.artifacts import ObjectInfo
from services.jobdb.checkpoints import (
    add_checkpoint,
    checkpoints_to_prune,
    delete_checkpoint_rows,
    get_checkpoint,
)
from services.jobdb.events import add_event
from services.jobdb.leases import update_progress
from services.jobdb.metrics import metric_rows, write_metrics
from services.jobdb.nonfinite import json_safe
from services.jobdb.retention import owner_artifact_bytes
from services.worker import phases
from services.worker.checkpoints.shards import ShardedUploads
from services.worker.checkpoints.uploads import ArtifactQuotaExceeded, CheckpointUploads
from services.worker.heartbeat import Heartbeat
from services.worker.retry import retry_while_unreachable

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
        uploads: sends each checkpoint the trainer writes to the artifact store.
        shards: a sharded (FSDP) model's checkpoints: rank 0's files stored and the row
            written once every rank stored its own (``services.worker.checkpoints.shards``).
        max_owner_bytes: the owner's quota of checkpoint bytes in the store (0: none); a
            checkpoint past it is not stored and the job fails (``ArtifactQuotaExceeded``).
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
        uploads: CheckpointUploads,
        heartbeat: Heartbeat | None = None,
        max_owner_bytes: int = 0,
        flush_every_steps: int = FLUSH_EVERY_STEPS,
        flush_every_s: float = FLUSH_EVERY_S,
        retry_for_s: float | None = None,
        shards: ShardedUploads | None = None,
    ) -> None:
        self.sessions = sessions
        self.job_id, self.attempt, self.worker_id = job_id, attempt, worker_id
        self.total_steps = total_steps
        self.keep_checkpoints = keep_checkpoints
        self.uploads = uploads
        self.shards = shards
        self.max_owner_bytes = max_owner_bytes
        self.heartbeat = heartbeat
        self.flush_every_steps, self.flush_every_s = flush_every_steps, flush_every_s
        self._rows: list[dict[str, Any]] = []
        self._steps_buffered = 0
        self._progress: dict[str, Any] = {}
        self._latest: dict[str, Any] = {}
        self._last_eval: dict[str, float] = {}
        self._checkpoint_steps: set[int] = set()
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
        # The checkpoint at this step (written just before the eval) gets its val_loss: its row
        # must exist first (evaluations are rare; waiting for one upload here is cheap).
        self.uploads.wait()
        pruned: list[str] = []

        def write(session: Session) -> None:
            self._write_buffer(session)
            checkpoint = get_checkpoint(session, self.job_id, step)
            if checkpoint is not None:
                self._record_checkpoint(session, checkpoint.key, step, checkpoint.epoch,
                                        checkpoint.size_bytes, checkpoint.sha256, checkpoint.metrics)
                pruned[:] = self._prune(session)

        self._write_retrying(write, f"evaluation at step {step}")
        self.uploads.delete(pruned)

    def on_checkpoint(self, trainer: Any, info: CheckpointInfo) -> None:
        self._check_quota(trainer, info)
        self._checkpoint_steps.add(info.step)
        epoch = self._epoch_of(info)
        sharded = info.path.is_dir()  # its files move into the node cache while it uploads

        def record(stored: ObjectInfo, upload_s: float) -> list[str]:
            pruned: list[str] = []
            # A sharded checkpoint's: that of the object its download serves (services.worker.checkpoints.shards).
            sha256 = stored.sha256 if sharded and stored.sha256 else info.sha256

            def write(session: Session) -> None:
                self._write_buffer(session)
                self._record_checkpoint(session, stored.key, info.step, epoch, stored.size,
                                        sha256, info.metrics)
                add_event(session, self.job_id, "checkpoint", f"checkpoint at step {info.step}",
                          {"step": info.step, "size_bytes": stored.size, "sha256": sha256,
                           "key": stored.key, "upload_s": round(upload_s, 3)},
                          attempt=self.attempt)
                pruned[:] = self._prune(session)

            self._write_retrying(write, f"checkpoint at step {info.step}")
            return pruned

        # Training goes on while it uploads; this waits only for the previous upload.
        if sharded:  # the row once every rank stored its files
            if self.shards is None:
                raise RuntimeError("a sharded checkpoint needs StoreCallback(shards=...) to store it")
            from accumcore.sharded_checkpoint import rank_files  # lazy: torch

            self.shards.submit(info.step, rank_files(info.path, 0), record)
            return
        self.uploads.submit(info.path, info.step, info.sha256, info.size_bytes, record)

    def _check_quota(self, trainer: Any, info: CheckpointInfo) -> None:
        if not self.max_owner_bytes:
            return
        self.uploads.wait()  # the previous checkpoint's row counts too
        with self.sessions() as session:
            used = owner_artifact_bytes(session, self.job_id)
        size = info.size_bytes
        if info.path.is_dir():  # sharded: ranks on other nodes keep their shards there
            from accumcore.distributed import world_size  # lazy: torch
            from accumcore.sharded_checkpoint import whole_size_estimate

            size = whole_size_estimate(info.path, world_size())
        if used + size <= self.max_owner_bytes:
            return
        if info.path.is_dir():  # a sharded checkpoint's staged folder
            shutil.rmtree(info.path, ignore_errors=True)
        else:
            info.path.unlink(missing_ok=True)
        message = (
            f"checkpoint at step {info.step} ({size} bytes) not written: this job's "
            f"owner already stores {used} bytes of checkpoints and "
            f"ACCUM_MAX_ARTIFACT_BYTES_PER_OWNER is {self.max_owner_bytes}; make room with "
            f"`accum delete ID` on finished jobs (or a lower keep_checkpoints), then "
            f"`accum resume {self.job_id}`"
        )
        self.on_event(trainer, "artifact_quota", message,
                      {"step": info.step, "size_bytes": size, "used_bytes": used,
                       "quota_bytes": self.max_owner_bytes})
        raise ArtifactQuotaExceeded(message)

    def _epoch_of(self, info: CheckpointInfo) -> int:
        """The 0-based epoch of the checkpoint's step (the epoch its metrics carry)."""
        if self._last_step_epoch is not None and self._last_step_epoch[0] == info.step:
            return self._last_step_epoch[1]
        return info.epoch

    def on_event(self, trainer: Any, kind: str, message: str, data: dict[str, Any]) -> None:
        if kind == "exactness_check":
            phases.mark("checks")
            # The check's figure as a metric at the step it ran before (0: the first window; a
            # pending check runs again on later windows), and the event's data JSON-safe (an
            # infinite error as its label).
            if isinstance(data.get("rel_error"), float):
                step = int(data.get("step") or 0)
                with self._buffer_lock:
                    self._rows.extend(metric_rows(step, getattr(trainer, "epoch", 0) if step else 0,
                                                  {"exactness_rel_error": data["rel_error"]}))
            data = json_safe(data)

        def write() -> None:
            with self.sessions.begin() as session:
                add_event(session, self.job_id, kind, message, dict(data), attempt=self.attempt)

        self._retrying(write, f"{kind} event")

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        phases.mark("train")
        self.close()

    # ---------------------------------------------------------------------- writing
    def close(self) -> None:
        """Wait for the upload in flight, stop the writer thread and write what is left (also
        called if fit raises); raises the upload's error, if it failed."""
        try:
            self.uploads.wait()
        finally:
            self._stop_writer()

    def _stop_writer(self) -> None:
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
        # Pruned objects go only once their rows' deletion committed (the callers delete them
        # after this returns): a crash in between leaves an object no row lists (the next
        # attempt removes it), never a row without its object.
        self._retrying(lambda: self._transaction(write), what)

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

    def _record_checkpoint(self, session: Session, key: str, step: int, epoch: int | None,
                           size_bytes: int, sha256: str, metrics: dict[str, Any]) -> None:
        merged = dict(metrics or {})
        if self._last_eval and int(self._last_eval.get("step", -1)) == step:
            merged.update({k: v for k, v in self._last_eval.items() if k not in ("step", "epoch")})
        add_checkpoint(session, self.job_id, step, key, size_bytes, sha256, epoch=epoch,
                       metrics=merged, attempt=self.attempt)

    def _prune(self, session: Session) -> list[str]:
        """Delete the rows of checkpoints past retention; returns their keys, whose objects
        the caller deletes after the commit."""
        doomed = checkpoints_to_prune(session, self.job_id, self.keep_checkpoints)
        delete_checkpoint_rows(session, self.job_id, [c.step for c in doomed])
        return [c.key for c in doomed]
