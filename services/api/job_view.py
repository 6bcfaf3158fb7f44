"""The job object as every answer carries it: `GET /v1/jobs/{id}`, submit, cancel, resume and
the SSE `status` event build it here, so they cannot drift apart (owner, attempts, exactness
check, tracker runs, place in line)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from services.api.schemas import JobPublic, NodePublic, TrackerRunPublic, exactness
from services.jobdb.events import latest_event
from services.jobdb.gangs import members_of, nodes_of
from services.jobdb.models import Job
from services.jobdb.queue_order import queue_position
from services.jobdb.status import JobStatus
from services.jobdb.tracker_runs import runs_of


def job_view(
    session: Session, job: Job, owner_name: str | None, *, position: bool = True,
    new: bool = False,
) -> JobPublic:
    """The job with its owner's name, its exactness check and, while it is queued, its place
    in line (`position=False` leaves that count over its queue out: the submit's hot path).
    `new`: the job was created by this request, so it has no check, tracker run or node yet:
    the queries that would say so are not made (the submit's hot path)."""
    # The lazy relation loads here, outside pydantic: a database error inside model_validate
    # reaches the client wrapped in a ValidationError, a 500, where an outage earns a 503.
    job.attempt_list  # noqa: B018
    public = JobPublic.model_validate(job)
    public.owner = owner_name  # (model_copy(update=...) costs 6 us more a job)
    check = None if new else latest_event(session, job.id, "exactness_check")
    public.exactness = exactness(job.spec or {}, check)
    if job.spec and job.spec.get("trackers"):
        runs = [] if new else runs_of(session, job.id)
        public.trackers = [TrackerRunPublic.model_validate(run) for run in runs]
    if nodes_of(job.spec)[0] > 1:
        members = [] if new else members_of(session, job.id)
        public.nodes = [NodePublic.model_validate(node) for node in members]
    if position and job.status == JobStatus.QUEUED:
        public.queue_position = queue_position(session, job)
    return public
