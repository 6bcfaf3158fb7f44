"""One attempt on one device: build the run, restore the checkpoint, ``Trainer.fit``."""

from __future__ import annotations

from accumcore import load_checkpoint
from accumcore.checkpoint import CheckpointWriteError
from services.settings import Settings
from services.spec import JobSpec
from services.store.sessions import session_factory
from services.store.status import resume_hint
from services.worker.attempt import Attempt, Outcome, prepare_resume
from services.worker.build import build_run
from services.worker.callbacks import StoreCallback
from services.worker.heartbeat import Heartbeat
from services.worker.micro_batch import record_choice, recorded_choice
from services.worker.warm_start import describe, job_initial_weights


def train_local(settings: Settings, spec: JobSpec, attempt: Attempt, heartbeat: Heartbeat) -> Outcome:
    """Returns ``SUCCEEDED``, ``CANCELLED``, ``HANDED_BACK`` (the worker is shutting down) or
    ``TIMED_OUT``, the last three checkpointed where they stopped, or ``LEASE_LOST``."""
    sessions = session_factory(settings)
    callback = StoreCallback(
        sessions, attempt.job_id, attempt.attempt, attempt.worker_id,
        total_steps=0, keep_checkpoints=spec.keep_checkpoints, heartbeat=heartbeat,
    )
    checkpoint_dir = settings.artifacts_path / attempt.job_id
    init_weights = job_initial_weights(sessions, spec, attempt.job_id)
    auto = spec.micro_batch_size == "auto"
    chosen = recorded_choice(sessions, attempt.job_id) if auto else None
    run = build_run(
        spec,
        callbacks=[callback],
        checkpoint_dir=checkpoint_dir,
        data_root_default=settings.home / "data",
        init_weights=init_weights,
        chosen=chosen,
    )
    if auto and chosen is None:
        record_choice(sessions, attempt.job_id, attempt.attempt, run.micro_batch_size, run.accumulation_steps)
    callback.total_steps = run.total_steps
    if run.warm_start is not None:
        callback.on_event(run.trainer, "warm_start", describe(run.warm_start), run.warm_start)
    for kind, message, data in run.notes:
        callback.on_event(run.trainer, kind, message, data)
    checkpoint = prepare_resume(sessions, attempt, checkpoint_dir)
    if checkpoint is not None:
        run.trainer.load_state_dict(load_checkpoint(checkpoint, map_location=run.trainer.device))
    try:
        history = run.trainer.fit(run.train_loader, **run.fit_kwargs)
        ended = outcome(history.stopped, heartbeat)
        if ended in (Outcome.HANDED_BACK, Outcome.CANCELLED, Outcome.TIMED_OUT):
            # Where it stopped (the last finished window), so a hand-back or a `resume` after
            # a cancel continues from there with the metrics up to it kept (the store
            # callback records it), not from an older checkpoint or the start.
            run.trainer.checkpoint()
    except CheckpointWriteError as exc:
        message = f"{exc.strerror or exc}; then {resume_hint(attempt.job_id)} continues from there"
        raise CheckpointWriteError.of(exc.errno, message) from exc
    finally:
        callback.close()  # on_fit_end did it, unless fit raised: stop the writer thread
    return ended


def outcome(stopped: bool, heartbeat: Heartbeat) -> Outcome:
    """How a ``fit`` that returned ended: stopped by a cancel, a shutdown or a lost lease, or
    run to its end."""
    if heartbeat.lease_lost:
        return Outcome.LEASE_LOST
    if stopped and not heartbeat.cancel_requested and heartbeat.timed_out:
        return Outcome.TIMED_OUT
    if stopped and not heartbeat.cancel_requested and heartbeat.shutting_down:
        return Outcome.HANDED_BACK
    if stopped:
        return Outcome.CANCELLED
    return Outcome.SUCCEEDED
