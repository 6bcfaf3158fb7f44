"""The trackers of one attempt: the callback rank 0's trainer calls, its host process started."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb.models import Job, Owner
from services.jobdb.tracker_runs import open_run
from services.settings import Settings
from services.spec import JobSpec, parse_spec
from services.spec.batching import effective_batch_size
from services.worker.attempt import Attempt
from services.worker.checkpoints.resume import checkpoint_uploads
from services.worker.checkpoints.uploads import CheckpointUploads
from services.worker.trackers.base import RunIdentity, flat_params
from services.worker.trackers.callback import TrackerCallback
from services.worker.trackers.handover import TrackerHost


def run_params(spec: JobSpec) -> dict[str, str]:
    """The spec as a run's parameters, the effective batch as a number: the normalised spec
    holds it only where it was given (else None, m x N x ranks being the rule), and the batch
    is what a run is compared by. An N schedule's is that of epoch 0."""
    return flat_params({**spec.normalised(), "effective_batch_size": effective_batch_size(spec)})


def job_trackers(settings: Settings, sessions: sessionmaker[Session], attempt: Attempt,
                 spec: JobSpec, uploads: CheckpointUploads) -> TrackerCallback | None:
    """The callback that logs this attempt to the job's trackers, or None when it names none.
    A tracker the spec names that this worker does not offer (settings changed since the
    submit) is left out, as a down one would be: the job goes on."""
    names = [name for name in spec.trackers if name in settings.trackers]
    if not names:
        return None
    identities = {}
    with sessions.begin() as session:  # one transaction: the job's names and its runs' rows
        job_name, owner, queue = session.execute(
            select(Job.name, Owner.name, Job.queue).join(Owner, Owner.id == Job.owner_id)
            .where(Job.id == attempt.job_id)).one()
        rows = {name: open_run(session, attempt.job_id, name) for name in names}
        stored = {name: (run.run_id, run.delivered_step) for name, run in rows.items()}
    for name in names:
        run_id, delivered = stored[name]
        identities[name] = RunIdentity(
            job_id=attempt.job_id, name=spec.name or job_name or attempt.job_id, owner=owner, queue=queue,
            params=run_params(spec), run_id=run_id, delivered_step=delivered,
            resume_step=attempt.resume_step or 0,
        )
    host = TrackerHost(settings, spec.normalised(), attempt.attempt, identities, sessions)
    callback = TrackerCallback(host, uploads, settings.tracker_end_wait_s)
    callback.start()
    return callback


def end_runs(settings: Settings, sessions: sessionmaker[Session], attempt: Attempt, status: str) -> None:
    """End the job's tracker runs ``status`` after its attempt is over, through the attempt's
    own callback: a job that failed once its restarts ran out after a fault that left no rank
    to end them (rank 0 died or was killed as hung). A run already ended is ended again with
    the same status."""
    spec = parse_spec(attempt.spec)
    callback = job_trackers(settings, sessions, attempt, spec, checkpoint_uploads(settings, attempt, None))
    if callback is not None:
        callback.end(status)
