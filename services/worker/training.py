"""One attempt on one device: build the run, restore the checkpoint, ``Trainer.fit``.

The trainer writes checkpoints into this node's staging directory; ``CheckpointUploads`` sends
them to the artifact store behind training, and the last one (final, or where a SIGTERM,
a cancel or a timeout stopped the job) is in the store before this returns.
"""

from __future__ import annotations

import contextlib

from accumcore import NonFiniteError, load_checkpoint
from accumcore.checkpoint import CheckpointWriteError
from services.settings import Settings
from services.spec import JobSpec
from services.store.sessions import session_factory
from services.store.status import resume_hint
from services.worker.attempt import Attempt, Outcome
from services.worker.build import build_run
from services.worker.callbacks import StoreCallback
from services.worker.heartbeat import Heartbeat
from services.worker.micro_batch import record_choice, recorded_choice
from services.worker.resume import checkpoint_uploads, prepare_resume
from services.worker.store_metrics import observe_fetch
from services.worker.trackers import job_trackers
from services.worker.warm_start import describe, job_initial_weights


def train_local(settings: Settings, spec: JobSpec, attempt: Attempt, heartbeat: Heartbeat) -> Outcome:
    """Returns ``SUCCEEDED``, ``CANCELLED``, ``HANDED_BACK`` (the worker is shutting down) or
    ``TIMED_OUT``, the last three checkpointed where they stopped, or ``LEASE_LOST``."""
    sessions = session_factory(settings)
    uploads = checkpoint_uploads(settings, attempt, heartbeat)
    callback = StoreCallback(
        sessions, attempt.job_id, attempt.attempt, attempt.worker_id,
        total_steps=0, keep_checkpoints=spec.keep_checkpoints, uploads=uploads,
        heartbeat=heartbeat, max_owner_bytes=settings.max_artifact_bytes_per_owner,
    )
    init_weights = job_initial_weights(
        sessions, spec, attempt.job_id,
        lambda key, sha: observe_fetch(lambda: uploads.cache.fetch(uploads.store, key, sha)),
    )
    trackers = job_trackers(settings, sessions, attempt, spec, uploads)
    auto = spec.micro_batch_size == "auto"
    chosen = recorded_choice(sessions, attempt.job_id) if auto else None
    run = build_run(
        spec,
        callbacks=[callback] if trackers is None else [callback, trackers],
        checkpoint_dir=uploads.staging_dir,
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
    checkpoint = prepare_resume(sessions, attempt, uploads.store, uploads.cache)
    if checkpoint is not None:
        run.trainer.load_state_dict(load_checkpoint(checkpoint, map_location=run.trainer.device))
    try:
        try:
            history = run.trainer.fit(run.train_loader, **run.fit_kwargs)
            ended = outcome(history.stopped, heartbeat)
            if ended in (Outcome.HANDED_BACK, Outcome.CANCELLED, Outcome.TIMED_OUT):
                # Where it stopped (the last finished window), so a hand-back or a `resume`
                # after a cancel continues from there with the metrics up to it kept (the
                # store callback records it), not from an older checkpoint or the start.
                run.trainer.checkpoint()
        except CheckpointWriteError as exc:
            message = f"{exc.strerror or exc}; then {resume_hint(attempt.job_id)} continues from there"
            raise CheckpointWriteError.of(exc.errno, message) from exc
        except NonFiniteError as exc:
            raise in_store(exc, f"{uploads.store.url}/{attempt.job_id}/") from exc
    except BaseException:
        with contextlib.suppress(Exception):  # the first error is the one to report
            callback.close()  # stop the writer thread
        if trackers is not None:
            trackers.end("failed")
        raise
    # on_fit_end closed it, unless a stop's checkpoint followed: that one is uploaded now,
    # before the job is handed back or finished. An upload that failed raises here.
    callback.close()
    if trackers is not None:
        trackers.end(TRACKED_END.get(ended))
    return ended


# How an attempt's end ends the job's tracker runs; the others leave them open for the next.
TRACKED_END = {Outcome.SUCCEEDED: "succeeded", Outcome.CANCELLED: "cancelled",
               Outcome.TIMED_OUT: "failed"}


def in_store(exc: NonFiniteError, prefix: str) -> NonFiniteError:
    """The error naming its last finite checkpoint where everyone finds it, the store, not
    this node's staging directory."""
    if exc.checkpoint is None:
        return exc
    return NonFiniteError(str(exc).replace(str(exc.checkpoint), prefix + exc.checkpoint.name),
                          step=exc.step, metric=exc.metric, value=exc.value,
                          checkpoint=exc.checkpoint)


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
