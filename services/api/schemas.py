"""Public JSON shapes of the API (response models), read from store rows by pydantic
(`from_attributes`): `JobPublic.model_validate(job)`. What a row may hold empty (NULL
JSON columns) is normalised by the validators here, so routes stay guard / do / return.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Steps and ids are INTEGER columns (32-bit on PostgreSQL): larger query values are refused
# as 422 instead of overflowing in the driver.
MAX_INT32 = 2**31 - 1

JobStatus = Literal["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]


def empty_if_null(value: Any) -> Any:
    """A JSON column the row holds as NULL (or empty) is answered as `{}`."""
    return value or {}


class Progress(BaseModel):
    epoch: int = 0
    optimizer_step: int = 0
    total_optimizer_steps: int | None = None

    # The worker writes the counts as it goes: a job not yet started has none, or nulls.
    _zero_if_null = field_validator("epoch", "optimizer_step", mode="before")(
        lambda count: count or 0
    )


class JobError(BaseModel):
    type: str
    message: str


class WorkerInfo(BaseModel):
    host: str | None
    gpu: str | None


# `owner` is not an attribute of the row: the /v1/jobs routes set it on the model
# (`routes/jobs.py`, `with_owner`); stream messages leave it out. (A docstring here
# would become the schema's description in the OpenAPI document.)
class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

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

    _empty_if_null = field_validator("progress", "latest_metrics", mode="before")(empty_if_null)

    @field_validator("error", mode="before")
    @classmethod
    def _error(cls, error: Any) -> Any:
        # The worker stores what it caught as a free-form dict: show its type and message.
        if not error:
            return None
        return {"type": str(error.get("type", "Error")), "message": str(error.get("message", ""))}


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
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    message: str
    data: dict[str, Any]
    attempt: int
    created_at: datetime

    _empty_if_null = field_validator("data", mode="before")(empty_if_null)


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
    model_config = ConfigDict(from_attributes=True)

    step: int
    epoch: int | None = Field(description=EPOCH_DOC)
    size_bytes: int
    sha256: str
    created_at: datetime
    metrics: dict[str, Any]
    is_best: bool

    _empty_if_null = field_validator("metrics", mode="before")(empty_if_null)


class CheckpointList(BaseModel):
    items: list[CheckpointPublic]


class CatalogList(BaseModel):
    items: list[dict[str, Any]]
