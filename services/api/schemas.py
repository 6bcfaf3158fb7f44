"""Public JSON shapes of the API (response models), built from store rows.

Builders read ORM rows into plain models here, so routes stay guard / do / return.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal, NotRequired

from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from services.store.models import Checkpoint, Job, JobEvent
from services.store.nonfinite import Label, label, split_latest

# Steps and ids are INTEGER columns (32-bit on PostgreSQL): larger query values are refused
# as 422 instead of overflowing in the driver.
MAX_INT32 = 2**31 - 1

JobStatus = Literal["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]


EPOCH_DOC = (
    "0-based index of the epoch (the first epoch is 0); the CLI and the dashboard show it "
    "counted from 1"
)
NONFINITE_DOC = (
    "NaN, inf or -inf when the value is not a finite number (`value` is null then: JSON has "
    "no such numbers); absent otherwise"
)


class Progress(BaseModel):
    epoch: int = Field(0, description=EPOCH_DOC)
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
    latest_metrics: dict[str, Any] = Field(
        description="The latest value of each metric; null where it is not finite "
        "(see nonfinite_metrics)"
    )
    nonfinite_metrics: dict[str, Label] = Field(
        default_factory=dict,
        description="The latest_metrics that are NaN, inf or -inf, by name (a diverged run)",
    )
    queue: str
    worker: WorkerInfo | None
    owner: str | None = Field(
        None, description="The owner's name (in the /v1/jobs answers; not in stream messages)"
    )

    @classmethod
    def from_row(cls, job: Job, owner: str | None = None) -> JobPublic:
        error = job.error
        progress = job.progress or {}
        latest, nonfinite = split_latest(job.latest_metrics or {})
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
            latest_metrics=latest,
            nonfinite_metrics=nonfinite,
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


class MetricPoint(BaseModel):
    name: str
    step: int
    epoch: int | None = Field(description=EPOCH_DOC)
    value: float | None
    ts: datetime
    nonfinite: Label | None = Field(None, description=NONFINITE_DOC)


class MetricPointDict(TypedDict):
    """A MetricPoint as a plain dict: the metrics page and the SSE stream serialise these
    without building models (the hot path of a dashboard)."""

    name: str
    step: int
    epoch: int | None
    value: float | None
    ts: datetime
    nonfinite: NotRequired[Label]


def metric_point(
    name: str, step: int, epoch: int | None, value: float | None, ts: Any
) -> MetricPointDict:
    """One point as answered: a NaN or infinity is a JSON null with its `nonfinite` label."""
    item: MetricPointDict = {"name": name, "step": step, "epoch": epoch, "value": value, "ts": ts}
    # The finite case first, in one comparison (a NaN fails it): a page has a thousand points.
    if value is None or not -math.inf < value < math.inf:
        item["nonfinite"] = label(value)  # type: ignore[typeddict-item]
    return item


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
