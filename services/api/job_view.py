"""The job object as every answer carries it: `GET /v1/jobs/{id}`, submit, cancel, resume and
the SSE `status` event build it here, so they cannot drift apart (owner, attempts, exactness
check, tracker runs, place in line)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from services.api.schemas import JobPublic, TrackerRunPublic, exactness
from services.store.events import latest_event
from services.store.models import Job
from services.store.queue_order import queue_position
from services.store.status import JobStatus
from services.store.tracker_runs import runs_of


def job_view(
    session: Session, job: Job, owner_name: str | None, *, position: bool = True
) -> JobPublic:
    """The job with its owner's name, its exactness check and, while it is queued, its place
    in line (`position=False` leaves that count over its queue out: the submit's hot path)."""
    public = JobPublic.model_validate(job)
    public.owner = owner_name  # (model_copy(update=...) costs 6 us more a job)
    public.exactness = exactness(job.spec or {}, latest_event(session, job.id, "exactness_check"))
    if job.spec and job.spec.get("trackers"):
        public.trackers = [TrackerRunPublic.model_validate(run) for run in runs_of(session, job.id)]
    if position and job.status == JobStatus.QUEUED:
        public.queue_position = queue_position(session, job)
    return public
