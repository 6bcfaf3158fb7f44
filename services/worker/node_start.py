"""What every node of an attempt does before its ranks start, leader or follower, through the
same functions: ``attempt_of`` (the attempt read from the job's row) and ``ready`` (the
start-phase admission checks on this node's own settings, then an ``s3://`` data root synced
into this node's cache).

    attempt = attempt_of(session, job, worker_id)            # the claim, a gang's join
    spec, attempt = ready(settings, spec, attempt)           # runner.train, gang_node.follow

The checkpoint an attempt resumes from is fetched by ``services.worker.launch`` (node 0 also
makes the store ready: ``checkpoints.resume``).
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.admission.context import Admission, Phase
from services.admission.pipeline import preflight
from services.data_roots import is_s3
from services.jobdb.models import Job, Owner
from services.settings import Settings
from services.spec import JobSpec
from services.worker.attempt import Attempt
from services.worker.datasets import with_local_data_root
from services.worker.micro_batch import chosen_of
from services.worker.offer import ranks_here


def attempt_of(session: Session, job: Job, worker_id: str) -> Attempt:
    """The attempt ``job`` (its row, claimed or joined) runs now under ``worker_id``."""
    return Attempt(job.id, job.attempts, worker_id, job.resume_step, dict(job.spec),
                   used_s=float(job.run_seconds or 0.0), micro_batch=chosen_of(job),
                   owner=session.scalar(select(Owner.name).where(Owner.id == job.owner_id)))


def ready(settings: Settings, spec: JobSpec, attempt: Attempt) -> tuple[JobSpec, Attempt]:
    """The spec and attempt this node's ranks build from. The API admitted the spec; each node
    checks it again on its own settings (an older allow-list, its own ACCUM_DATA_ROOTS, a job
    stored past the API, the ranks it offers) before anything is read or synced, and raises
    the refusing check's error (``admission.pipeline.preflight``), which says the fix. An s3 root becomes this node's synced copy, in the
    attempt's spec too (spawned ranks build from it)."""
    preflight(Admission(spec, settings, Phase.START, job_id=attempt.job_id, owner_name=attempt.owner,
                        ranks=lambda: ranks_here(settings)))
    if is_s3(spec.dataset.data_root):
        spec = with_local_data_root(settings, spec, attempt.owner)  # our own cache, trusted as the s3 root
        attempt = replace(attempt, spec={**attempt.spec, "dataset": spec.dataset.normalised()})
    return spec, attempt
