"""One attempt on one device: build the run, restore the checkpoint, ``Trainer.fit``.

The trainer writes checkpoints into this node's staging directory; ``CheckpointUploads`` sends
them to the artifact store behind training, and the last one (final, or where a SIGTERM
stopped the job) is in the store before this returns.
"""

from __future__ import annotations

import contextlib
from typing import Any

from accumcore import NonFiniteError, load_checkpoint
from accumcore.checkpoint import CheckpointWriteError
from services.spec import JobSpec
from services.worker.build import build_run
from services.worker.callbacks import StoreCallback
from services.worker.db import session_factory
from services.worker.heartbeat import Heartbeat
from services.worker.runner import HANDED_BACK, Attempt, checkpoint_uploads, prepare_resume


def train_local(settings: Any, spec: JobSpec, attempt: Attempt, heartbeat: Heartbeat) -> str | None:
    """Returns ``succeeded``, ``cancelled``, ``HANDED_BACK`` (the worker is shutting down; the
    job is checkpointed where it stopped), or None when the lease was lost mid-run."""
    sessions = session_factory(settings)
    uploads = checkpoint_uploads(settings, attempt, heartbeat)
    callback = StoreCallback(
        sessions, attempt.job_id, attempt.attempt, attempt.worker_id,
        total_steps=0, keep_checkpoints=spec.keep_checkpoints, uploads=uploads,
        heartbeat=heartbeat, max_owner_bytes=settings.max_artifact_bytes_per_owner,
    )
    run = build_run(
        spec,
        callbacks=[callback],
        checkpoint_dir=uploads.staging_dir,
        data_root_default=settings.home / "data",
    )
    callback.total_steps = run.total_steps
    checkpoint = prepare_resume(sessions, attempt, uploads.store, uploads.cache)
    if checkpoint is not None:
        run.trainer.load_state_dict(load_checkpoint(checkpoint, map_location=run.trainer.device))
    try:
        try:
            history = run.trainer.fit(run.train_loader, **run.fit_kwargs)
            status = outcome(history.stopped, heartbeat)
            if status == HANDED_BACK:
                run.trainer.checkpoint()  # where it stopped: the store callback records it
        except CheckpointWriteError as exc:
            message = f"{exc.strerror or exc}; then `accum resume {attempt.job_id}` continues from there"
            raise CheckpointWriteError.of(exc.errno, message) from exc
        except NonFiniteError as exc:
            raise in_store(exc, f"{uploads.store.url}/{attempt.job_id}/") from exc
    except BaseException:
        with contextlib.suppress(Exception):  # the first error is the one to report
            callback.close()  # stop the writer thread
        raise
    # on_fit_end closed it, unless a SIGTERM checkpoint followed: that one is uploaded now,
    # before the job is handed back. An upload that failed raises here (a store fault).
    callback.close()
    return status


def in_store(exc: NonFiniteError, prefix: str) -> NonFiniteError:
    """The error naming its last finite checkpoint where everyone finds it, the store, not
    this node's staging directory."""
    if exc.checkpoint is None:
        return exc
    return NonFiniteError(str(exc).replace(str(exc.checkpoint), prefix + exc.checkpoint.name),
                          step=exc.step, metric=exc.metric, value=exc.value,
                          checkpoint=exc.checkpoint)


def outcome(stopped: bool, heartbeat: Heartbeat) -> str | None:
    if heartbeat.lease_lost:
        return None
    if stopped and not heartbeat.cancel_requested and heartbeat.shutting_down:
        return HANDED_BACK
    if stopped:
        return "cancelled"
    return "succeeded"
