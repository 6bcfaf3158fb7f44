"""`GET /metrics`: Prometheus text for scrapers (jobs by status, queue depth, workers by queue
and state, worker heartbeat age, request latency, lifecycle counters from the event log, failed
token checks, open streams, the artifact store's errors and retained bytes (uploads: the workers' own histograms);
docs/operations.md)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from services.api.deps import SessionDep, SettingsDep
from services.api.telemetry import Telemetry
from services.dispatch.broker import DEFAULT_QUEUE
from services.jobdb import workers as store_workers
from services.jobdb.events import lifecycle_counts
from services.jobdb.models import Checkpoint, Job, JobEvent
from services.jobdb.status import JobStatus

router = APIRouter(tags=["monitoring"])


def require_metrics_token(settings: SettingsDep, request: Request) -> None:
    """With ACCUM_METRICS_TOKEN set, a scrape must bring it as a bearer token (401 otherwise)."""
    if settings.metrics_token is None or not settings.metrics_token.get_secret_value():
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    expected = settings.metrics_token.get_secret_value()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "GET /metrics needs the scraper's token (ACCUM_METRICS_TOKEN): send "
            '"Authorization: Bearer <token>" (Prometheus: authorization: {credentials: ...})',
            headers={"WWW-Authenticate": "Bearer"},
        )


@router.get("/metrics", response_class=Response, include_in_schema=False,
            dependencies=[Depends(require_metrics_token)])
def prometheus_metrics(
    *, session: SessionDep, settings: SettingsDep, request: Request
) -> Response:
    """Prometheus exposition; the job gauges are read from the store at scrape time."""
    telemetry = request.app.state.telemetry
    counts = session.execute(
        select(Job.status, Job.queue, func.count()).group_by(Job.status, Job.queue)
    ).all()
    by_status: dict[str, int] = dict.fromkeys(JobStatus, 0)
    queued = {DEFAULT_QUEUE: 0}
    for job_status, queue, count in counts:
        by_status[job_status] = by_status.get(job_status, 0) + count
        if job_status == JobStatus.QUEUED:
            queued[queue] = count
    for job_status, count in by_status.items():
        telemetry.jobs.labels(status=job_status).set(count)
    telemetry.queue_depth.clear()
    for queue, count in queued.items():
        telemetry.queue_depth.labels(queue=queue).set(count)
    worker_gauges(session, telemetry, settings.lease_timeout_s)
    telemetry.lifecycle.counts = lifecycle_counts(session)
    telemetry.event_streams.set(request.app.state.stream_slots.total)
    artifact_gauges(session, request)
    return Response(generate_latest(telemetry.registry), media_type=CONTENT_TYPE_LATEST)


def artifact_gauges(session: Session, request: Request) -> None:
    """The artifact store's gauges, read from the job database: faults the workers recorded,
    this API's failed probes, the bytes retained. Upload seconds and bytes are the workers' own
    histograms (`accum_worker_checkpoint_upload_*`, each worker's /metrics), not repeated here."""
    telemetry = request.app.state.telemetry
    faults = session.scalar(select(func.count()).where(JobEvent.kind == "store_fault"))
    telemetry.store_errors.labels(source="workers").set(faults or 0)
    telemetry.store_errors.labels(source="api").set(request.app.state.store_probe.failures)
    telemetry.stored_bytes.set(session.scalar(select(func.sum(Checkpoint.size_bytes))) or 0)


def worker_gauges(session: Session, telemetry: Telemetry, lease_timeout_s: float) -> None:
    """`accum_workers{queue,state}` and each live or lost worker's heartbeat age."""
    telemetry.workers.clear()
    telemetry.worker_heartbeat_age.clear()
    for view in store_workers.list_workers(session, lease_timeout_s):
        for queue in view.row.queues:
            telemetry.workers.labels(queue=queue, state=view.state).inc()
        if view.state != "stopped":
            telemetry.worker_heartbeat_age.labels(worker=view.row.name).set(view.heartbeat_age_s)
