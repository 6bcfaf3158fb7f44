"""Public JSON shapes of the API (response models), built from store rows.

Builders read ORM rows into plain models here, so routes stay guard / do / return.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from services.store.models import Checkpoint, Job, JobEvent

# Steps and ids are INTEGER columns (32-bit on PostgreSQL): larger query values are refused
# as 422 instead of overflowing in the driver.
MAX_INT32 = 2**31 - 1

JobStatus = Literal["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]


class Progress(BaseModel):
    epoch: int = 0
    optimizer_step: int = 0
    total_optimizer_steps: int | None = None


class JobError(BaseModel):
    type: str
    message: str


class WorkerInfo(BaseModel):
    host: str | None
    gpu: str | None


class JobPublic(BaseModel):
    id: str
    name: str | None
    status: JobStatus
    spec: dict[str, Any]
    effective_batch_size: int | None
    progress: Progress
    attempts: int
    error: JobError | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    latest_metrics: dict[str, Any]
    queue: str
    worker: WorkerInfo | None
    owner: str | None = Field(
        None, description="The owner's name (in the /v1/jobs answers; not in stream messages)"
    )

    @classmethod
    def from_row(cls, job: Job, owner: str | None = None) -> JobPublic:
        error = job.error
        progress = job.progress or {}
        return cls(
            id=job.id,
            name=job.name,
            status=job.status,  # type: ignore[arg-type]
            spec=job.spec,
            effective_batch_size=job.effective_batch_size,
            progress=Progress(
                epoch=progress.get("epoch") or 0,
                optimizer_step=progress.get("optimizer_step") or 0,
                total_optimizer_steps=progress.get("total_optimizer_steps"),
            ),
            attempts=job.attempts,
            error=JobError(
                type=str(error.get("type", "Error")), message=str(error.get("message", ""))
            )
            if error
            else None,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            latest_metrics=job.latest_metrics or {},
            queue=job.queue,
            worker=WorkerInfo(host=job.worker_host, gpu=job.worker_gpu)
            if job.worker_host or job.worker_gpu
            else None,
            owner=owner,
        )


class OwnerPublic(BaseModel):
    name: str
    is_admin: bool


class TokenPublic(BaseModel):
    """A token as listed: never the token itself (it is stored as a hash), only its prefix."""

    owner: str
    prefix: str = Field(description="The first 12 characters: enough to tell tokens apart")
    created_at: datetime
    revoked_at: datetime | None = None


class TokenList(BaseModel):
    items: list[TokenPublic]


class TokenCreated(TokenPublic):
    token: str = Field(description="The new bearer token, shown this once: store it now")


class JobPage(BaseModel):
    items: list[JobPublic]
    next_cursor: str | None


class EventPublic(BaseModel):
    id: int
    kind: str
    message: str
    data: dict[str, Any]
    attempt: int
    created_at: datetime

    @classmethod
    def from_row(cls, event: JobEvent) -> EventPublic:
        return cls(
            id=event.id,
            kind=event.kind,
            message=event.message,
            data=event.data or {},
            attempt=event.attempt,
            created_at=event.created_at,
        )


class EventList(BaseModel):
    items: list[EventPublic]


EPOCH_DOC = "0-based index of the epoch the optimizer step belongs to (the first epoch is 0)"


class MetricPoint(BaseModel):
    name: str
    step: int
    epoch: int | None = Field(description=EPOCH_DOC)
    value: float | None
    ts: datetime


class MetricPage(BaseModel):
    items: list[MetricPoint]
    next_cursor: str | None


class CheckpointPublic(BaseModel):
    step: int
    epoch: int | None = Field(description=EPOCH_DOC)
    size_bytes: int
    sha256: str
    created_at: datetime
    metrics: dict[str, Any]
    is_best: bool

    @classmethod
    def from_row(cls, row: Checkpoint) -> CheckpointPublic:
        return cls(
            step=row.step,
            epoch=row.epoch,
            size_bytes=row.size_bytes,
            sha256=row.sha256,
            created_at=row.created_at,
            metrics=row.metrics or {},
            is_best=row.is_best,
        )


class CheckpointList(BaseModel):
    items: list[CheckpointPublic]


class CatalogList(BaseModel):
    items: list[dict[str, Any]]
