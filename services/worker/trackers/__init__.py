"""A job's runs in the experiment trackers its spec names (MLflow, TensorBoard, W&B).

    callback = job_trackers(settings, sessions, attempt, spec, uploads)  # None: no trackers
    run = build_run(spec, callbacks=[store_callback, callback], ...)
    ...; callback.end("succeeded")

One module per tracker (each imports its client only when a job asks for it: the
``trackers`` extra), a batching sink per tracker (``sink``), the trainer callback
(``callback``). The API never imports this package.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.settings import Settings
from services.spec import JobSpec
from services.store.models import Job, Owner
from services.worker.attempt import Attempt
from services.worker.trackers.base import RunIdentity, Tracker, flat_params
from services.worker.trackers.callback import TrackerCallback
from services.worker.trackers.sink import TrackerSink, ensure_row
from services.worker.uploads import CheckpointUploads


def make_tracker(name: str, settings: Settings, spec: JobSpec, uploads: CheckpointUploads) -> Tracker:
    if name == "mlflow":
        from services.worker.trackers.mlflow_tracker import MlflowTracker

        return MlflowTracker(settings.mlflow_tracking_uri, settings.mlflow_experiment,
                             spec.register_model)
    if name == "tensorboard":
        from services.worker.trackers.tensorboard_tracker import TensorBoardTracker

        local_root = (settings.artifacts_path if not settings.artifacts_on_s3
                      else uploads.cache.staging_dir(uploads.job_id))
        return TensorBoardTracker(uploads.store, local_root, settings.tensorboard_url)
    from services.worker.trackers.wandb_tracker import WandbTracker

    return WandbTracker(settings.wandb_mode, settings.wandb_project, settings.wandb_entity,
                        settings.wandb_path / uploads.job_id, settings.wandb_base_url)


def job_trackers(settings: Settings, sessions: sessionmaker[Session], attempt: Attempt,
                 spec: JobSpec, uploads: CheckpointUploads) -> TrackerCallback | None:
    """The callback that logs this attempt to the job's trackers, or None when it names none.
    A tracker the spec names that this worker does not offer (settings changed since the
    submit) is left out, as a down one would be: the job goes on."""
    names = [name for name in spec.trackers if name in settings.trackers]
    if not names:
        return None
    with sessions() as session:
        job_name, owner, queue = session.execute(
            select(Job.name, Owner.name, Job.queue).join(Owner, Owner.id == Job.owner_id)
            .where(Job.id == attempt.job_id)).one()
    sinks = []
    for name in names:
        run_id, delivered = ensure_row(sessions, attempt.job_id, name)
        identity = RunIdentity(
            job_id=attempt.job_id, name=spec.name or job_name or attempt.job_id, owner=owner, queue=queue,
            params=flat_params(spec.normalised()), run_id=run_id, delivered_step=delivered,
            resume_step=attempt.resume_step or 0,
        )
        sinks.append(TrackerSink(make_tracker(name, settings, spec, uploads), sessions, identity,
                                 attempt.attempt, settings.tracker_flush_every_s))
    return TrackerCallback(sinks, uploads, settings.tracker_end_wait_s)
