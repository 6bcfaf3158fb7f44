"""Jobs: submit (idempotent), list, read, cancel, resume, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Header, HTTPException, Query, Request, Response, status
from sqlalchemy.orm import Session

from services.admission import pipeline as admission
from services.admission.context import Admission, Phase
from services.api.auth import CurrentOwner
from services.api.deps import ArtifactsDep, SessionDep, SettingsDep
from services.api.errors import Problem, invalid_field, problem_responses, refused
from services.api.job_view import job_view
from services.api.schemas import (
    MAX_TAGS,
    JobEdit,
    JobPage,
    JobPublic,
    JobStatus,
    ResumeRequest,
    Tag,
)
from services.artifacts import StoreUnavailable
from services.dispatch.unsent import publish_in_order
from services.fleet import FleetView
from services.jobdb import jobs as store_jobs
from services.jobdb import tokens as store_tokens
from services.jobdb.checkpoints import list_checkpoints
from services.jobdb.errors import (
    ActiveJobCapReached,
    IdempotencyConflict,
    InvalidCursor,
    JobStateError,
)
from services.jobdb.job_ids import AmbiguousJobId, find_job, not_found_detail
from services.jobdb.models import Job, Owner
from services.jobdb.queue_order import PRIORITIES
from services.settings import Settings
from services.spec import JobSpec, effective_batch_size, total_optimizer_steps

router = APIRouter(
    prefix="/v1/jobs",
    tags=["jobs"],
    responses=problem_responses(401, 422, 429, 503),
)

NOT_FOUND = problem_responses(404)


def job_or_404(session: Session, job_id: str, owner: Owner) -> Job:
    """The job whose id is `job_id` or starts with it, if this owner may see it; another
    owner's job is a 404, never a 403; a prefix of several ids is a 422 naming them."""
    try:
        job = find_job(session, job_id, owner, anyones=owner.is_admin)
    except AmbiguousJobId as exc:
        raise invalid_field(("path", "job_id"), str(exc), job_id, exc.candidates) from exc
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=not_found_detail(job_id))
    return job


def owner_names(session: Session, owner: Owner, jobs: list[Job]) -> dict[int, str]:
    """Names of the jobs' owners: the caller's is known; only an admin's answer can hold
    other owners' jobs, and only those cost a query (not an admin's own submit or read)."""
    names = {owner.id: owner.name}
    others = {j.owner_id for j in jobs} - names.keys() if owner.is_admin else set()
    return names | store_tokens.owner_names(session, others) if others else names


def with_owner(job: Job, names: dict[int, str]) -> JobPublic:
    """The job as listed, with its owner's name from `names` (`owner_names`)."""
    public = JobPublic.model_validate(job)
    public.owner = names.get(job.owner_id)  # (model_copy(update=...) costs 6 us more a job)
    return public


def job_public(session: Session, owner: Owner, job: Job, *, position: bool = True,
               new: bool = False) -> JobPublic:
    """The job as answered (`job_view`: the stream's `status` carries the same object: owner,
    attempts, exactness check, place in line). `position=False` leaves out a queued job's place
    in line: a count over its queue that the submit's hot path does not pay for
    (`GET /v1/jobs/{id}` has it)."""
    names = owner_names(session, owner, [job])
    return job_view(session, job, names.get(job.owner_id), position=position, new=new)


def cap_reached(session: Session, exc: ActiveJobCapReached) -> Problem:
    """429 for a submit or resume past the owner's cap; nothing of it is kept."""
    session.rollback()
    return Problem(
        status.HTTP_429_TOO_MANY_REQUESTS,
        "Too many active jobs",
        str(exc),
        max_active_jobs=exc.cap,
        active_jobs=exc.active,
    )


def admitted(session: Session, spec: JobSpec, settings: Settings, owner: Owner,
             fleet: FleetView) -> JobSpec:
    """The spec past every admission check (services/admission: a 422 with the refusals of the
    first check that refuses it), with this service's defaults filled in."""
    try:
        return admission.submit(Admission(spec, settings, Phase.SUBMIT, owner=owner,
                                          session=session, fleet=fleet))
    except admission.Refused as exc:
        raise refused(exc.refusals) from exc


def stored(session: Session, spec: JobSpec, owner: Owner, settings: Settings,
           idempotency_key: str | None) -> tuple[Job, bool]:
    """The job written and committed, ``(job, created)``: the one stored before for the same
    Idempotency-Key and spec (409 for another spec under it), or 429 past the owner's cap."""
    try:
        job, created = store_jobs.create_job(
            session,
            owner=owner,
            spec=spec.normalised(),
            name=spec.name,
            queue=spec.queue,
            max_restarts=spec.max_restarts,
            effective_batch_size=effective_batch_size(spec),
            total_optimizer_steps=total_optimizer_steps(spec),
            idempotency_key=idempotency_key,
            max_active_jobs=settings.max_active_jobs_per_owner,
            priority=PRIORITIES[spec.priority],
            tags=spec.tags,
            notes=spec.notes,
        )
        session.commit()
    except IdempotencyConflict as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    except ActiveJobCapReached as exc:
        raise cap_reached(session, exc) from exc
    return job, created


def enqueue_after_commit(settings: Settings, job: Job) -> None:
    """Nudge a worker. The row is committed already, so a broker failure must not turn into
    an error for a job that exists: it stays queued, marked unsent, and is sent in submit order
    once the broker is back (`/readyz` reports the broker down meanwhile)."""
    publish_in_order(settings, job.id, job.queue, job.priority)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobPublic,
    responses={
        200: {
            "model": JobPublic,
            "description": "Same Idempotency-Key and body: the job created before",
        },
        **problem_responses(
            400,
            (409, "Idempotency-Key already used with a different body"),
            413,
            (429, "You have ACCUM_MAX_ACTIVE_JOBS_PER_OWNER unfinished jobs, or bad tokens"),
        ),
    },
)
def submit_job(
    *,
    session: SessionDep,
    owner: CurrentOwner,
    settings: SettingsDep,
    request: Request,
    response: Response,
    spec: JobSpec,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
) -> JobPublic:
    """Submit a training job; it is queued and a worker picks it up."""
    spec = admitted(session, spec, settings, owner, request.app.state.fleet)
    job, created = stored(session, spec, owner, settings, idempotency_key)
    if created:
        enqueue_after_commit(settings, job)
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job_public(session, owner, job, position=False, new=created)


@router.get("", response_model=JobPage)
def list_jobs(
    *,
    session: SessionDep,
    owner: CurrentOwner,
    status_: Annotated[JobStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    tag: Annotated[list[Tag] | None, Query(max_length=MAX_TAGS,
                                           description="Only jobs with this tag (repeat: all of them)")] = None,
    q: Annotated[str | None, Query(min_length=1, max_length=200,
                                   description="Only jobs whose name, notes or a tag contain it")] = None,
) -> JobPage:
    """Your jobs (all jobs for an admin), newest first, one page at a time; `tag` and `q`
    narrow the list."""
    try:
        rows, next_cursor = store_jobs.list_jobs(session, owner, status_, limit, cursor,
                                                 tags=tag, text=q)
    except InvalidCursor as exc:
        raise invalid_field(("query", "cursor"), str(exc), cursor) from exc
    names = owner_names(session, owner, rows)
    return JobPage(
        items=[with_owner(j, names) for j in rows], next_cursor=next_cursor
    )


@router.get("/{job_id}", response_model=JobPublic, responses=NOT_FOUND)
def read_job(*, session: SessionDep, owner: CurrentOwner, job_id: str) -> JobPublic:
    """One job: status, progress, latest metrics, error."""
    job = job_or_404(session, job_id, owner)
    return job_public(session, owner, job)


@router.patch(
    "/{job_id}", response_model=JobPublic,
    responses={**NOT_FOUND, **problem_responses(400, 413)},
)
def edit_job(*, session: SessionDep, owner: CurrentOwner, job_id: str, body: JobEdit) -> JobPublic:
    """Rename a job, set its tags or its notes (any job state; the spec is not changed)."""
    job = job_or_404(session, job_id, owner)
    store_jobs.edit_job(session, job, name=body.name, tags=body.tags, notes=body.notes)
    session.commit()
    return job_public(session, owner, job)


@router.post(
    "/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobPublic,
    responses={**NOT_FOUND, **problem_responses((409, "The job has already finished"))},
)
def cancel_job(*, session: SessionDep, owner: CurrentOwner, job_id: str) -> JobPublic:
    """Cancel: a queued job at once, a running one at its next micro-batch."""
    job = job_or_404(session, job_id, owner)
    try:
        store_jobs.request_cancel(session, job)
        session.commit()
    except JobStateError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    return job_public(session, owner, job)


@router.post(
    "/{job_id}/resume",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobPublic,
    responses={
        **NOT_FOUND,
        **problem_responses(
            400,
            (409, "The job is not failed or cancelled"),
            (429, "The owner has ACCUM_MAX_ACTIVE_JOBS_PER_OWNER unfinished jobs, or bad tokens"),
            413,
        ),
    },
)
def resume_job(
    *, session: SessionDep, owner: CurrentOwner, settings: SettingsDep, job_id: str,
    body: Annotated[ResumeRequest | None, Body()] = None,
) -> JobPublic:
    """Re-queue a failed or cancelled job from its latest checkpoint, from the checkpoint at
    `from_step`, or `from_scratch`; with `timeout`, under a new timeout (the run time counts
    from 0 again on every resume)."""
    job = job_or_404(session, job_id, owner)
    job_id = job.id  # the path may hold a prefix of it
    body = body or ResumeRequest(from_step=None, from_scratch=False, timeout=None)
    if body.from_step is not None:
        steps = [c.step for c in list_checkpoints(session, job_id)]
        if body.from_step not in steps:
            raise invalid_field(
                ("body", "from_step"),
                f"job {job_id} has no checkpoint at step {body.from_step}; "
                + (f"its checkpoints are at steps {', '.join(map(str, steps))}" if steps
                   else "it has none") + " (or resume with from_scratch: true)",
                body.from_step, allowed=steps,
            )
    if body.timeout is not None and int(body.timeout) > settings.max_job_seconds:
        raise invalid_field(
            ("body", "timeout"),
            f"timeout must be at most {settings.max_job_seconds} s on this service "
            f"(ACCUM_MAX_JOB_SECONDS); got {body.timeout} s",
            body.timeout,
        )
    try:
        store_jobs.request_resume(session, job, settings.max_active_jobs_per_owner,
                                  from_step=body.from_step, from_scratch=body.from_scratch,
                                  timeout_s=int(body.timeout) if body.timeout else None)
        session.commit()
    except JobStateError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    except ActiveJobCapReached as exc:
        raise cap_reached(session, exc) from exc
    enqueue_after_commit(settings, job)
    return job_public(session, owner, job)


@router.delete(
    "/{job_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={**NOT_FOUND, **problem_responses((409, "The job has not finished: cancel it first"))},
)
def delete_job(*, session: SessionDep, owner: CurrentOwner, store: ArtifactsDep,
               job_id: str) -> Response:
    """Delete a finished job: its checkpoints (objects and rows), metrics and events."""
    job = job_or_404(session, job_id, owner)
    job_id = job.id  # the path may hold a prefix of it
    if not store_jobs.is_finished(job):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"job {job_id} is {job.status}; cancel it first (`accum cancel {job_id}`), "
            "then delete it once it is cancelled",
        )
    try:
        for stored in store.list(f"{job_id}/"):
            store.delete(stored.key)
    except StoreUnavailable as exc:
        raise Problem(status.HTTP_503_SERVICE_UNAVAILABLE, "Artifact Store Unavailable",
                      f"{exc}; the deletion stopped part way: retry it", headers={"Retry-After": "5"}) from exc
    try:
        store_jobs.delete_finished_job(session, job)
        session.commit()
    except JobStateError as exc:  # resumed meanwhile
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    return Response(status_code=status.HTTP_204_NO_CONTENT)
