"""One attempt on one device: build the run, restore the checkpoint, ``Trainer.fit``."""

from __future__ import annotations

from typing import Any

from accumcore import load_checkpoint
from accumcore.checkpoint import CheckpointWriteError
from services.spec import JobSpec
from services.worker.build import build_run
from services.worker.callbacks import StoreCallback
from services.worker.db import session_factory
from services.worker.heartbeat import Heartbeat
from services.worker.micro_batch import record_choice, recorded_choice
from services.worker.runner import HANDED_BACK, Attempt, prepare_resume


def train_local(settings: Any, spec: JobSpec, attempt: Attempt, heartbeat: Heartbeat) -> str | None:
    """Returns ``succeeded``, ``cancelled``, ``HANDED_BACK`` (the worker is shutting down; the
    job is checkpointed where it stopped), or None when the lease was lost mid-run."""
    sessions = session_factory(settings)
    callback = StoreCallback(
        sessions, attempt.job_id, attempt.attempt, attempt.worker_id,
        total_steps=0, keep_checkpoints=spec.keep_checkpoints, heartbeat=heartbeat,
    )
    checkpoint_dir = settings.artifacts_path / attempt.job_id
    auto = spec.micro_batch_size == "auto"
    chosen = recorded_choice(sessions, attempt.job_id) if auto else None
    run = build_run(
        spec,
        callbacks=[callback],
        checkpoint_dir=checkpoint_dir,
        data_root_default=settings.home / "data",
        chosen=chosen,
    )
    if auto and chosen is None:
        record_choice(sessions, attempt.job_id, attempt.attempt, run.micro_batch_size, run.accumulation_steps)
    callback.total_steps = run.total_steps
    for kind, message, data in run.notes:
        callback.on_event(run.trainer, kind, message, data)
    checkpoint = prepare_resume(sessions, attempt, checkpoint_dir)
    if checkpoint is not None:
        run.trainer.load_state_dict(load_checkpoint(checkpoint, map_location=run.trainer.device))
    try:
        history = run.trainer.fit(run.train_loader, **run.fit_kwargs)
        status = outcome(history.stopped, heartbeat)
        if status == HANDED_BACK:
            run.trainer.checkpoint()  # where it stopped: the store callback records it
    except CheckpointWriteError as exc:
        message = f"{exc.strerror or exc}; then `accum resume {attempt.job_id}` continues from there"
        raise CheckpointWriteError.of(exc.errno, message) from exc
    finally:
        callback.close()  # on_fit_end did it, unless fit raised: stop the writer thread
    return status


def outcome(stopped: bool, heartbeat: Heartbeat) -> str | None:
    if heartbeat.lease_lost:
        return None
    if stopped and not heartbeat.cancel_requested and heartbeat.shutting_down:
        return HANDED_BACK
    if stopped:
        return "cancelled"
    return "succeeded"
