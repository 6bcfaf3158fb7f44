"""A job's per-step metrics: keyset pages, or a shape-keeping downsample of long runs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import TypeAdapter
from typing_extensions import TypedDict

from services.api.auth import CurrentOwner
from services.api.deps import SessionDep
from services.api.errors import invalid_field, problem_responses
from services.api.routes.jobs import NOT_FOUND, job_or_404
from services.api.schemas import MAX_INT32, MetricPage, MetricPointDict, metric_point
from services.jobdb import metrics as store_metrics
from services.jobdb.downsample import downsample_metrics
from services.jobdb.errors import InvalidCursor

router = APIRouter(
    prefix="/v1/jobs",
    tags=["metrics"],
    responses=problem_responses(401, 422, 429, 503),
)


# Metric names are identifiers such as `loss`, `val_accuracy`, `train/loss`: anything else in
# the filter (quotes, spaces, SQL) is refused as 422 rather than searched for.
METRIC_NAME = r"^[A-Za-z0-9_.:/-]+$"


class _Page(TypedDict):
    items: list[MetricPointDict]
    next_cursor: str | None


# Same JSON as MetricPage (the documented response model), serialised from plain dicts: a
# 1000-point page is the hot path of a dashboard, and building 1000 models and validating
# them again for the response model costs about 4x this.
_PAGE_JSON = TypeAdapter(_Page)


def page_response(rows: list[Any], next_cursor: str | None) -> Response:
    """The page as JSON; rows come from our own store, so they need no validation."""
    items = [metric_point(m.name, m.step, m.epoch, m.value, m.ts) for m in rows]
    body = _PAGE_JSON.dump_json({"items": items, "next_cursor": next_cursor})
    return Response(body, media_type="application/json")


@router.get("/{job_id}/metrics", response_model=MetricPage, responses=NOT_FOUND)
def read_metrics(
    *,
    session: SessionDep,
    owner: CurrentOwner,
    job_id: str,
    name: Annotated[str | None, Query(max_length=100, pattern=METRIC_NAME)] = None,
    since_step: Annotated[int | None, Query(ge=0, le=MAX_INT32)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    cursor: Annotated[str | None, Query(max_length=300)] = None,
    max_points: Annotated[
        int | None,
        Query(ge=2, le=100_000, description="Downsample each metric to at most this many points"),
    ] = None,
) -> Response:
    """Metric points ordered by (name, step); `max_points` keeps each curve's min/max shape."""
    job_id = job_or_404(session, job_id, owner).id  # the path may hold a prefix of it
    if max_points is not None:
        if cursor is not None:
            raise invalid_field(
                ("query", "cursor"), "a downsampled history is one page: omit cursor", cursor
            )
        names = [name] if name is not None else store_metrics.metric_names(session, job_id)
        rows = [
            m
            for n in names
            for m in downsample_metrics(session, job_id, n, max_points)
            if since_step is None or m.step > since_step
        ]
        return page_response(rows, None)
    try:
        rows, next_cursor = store_metrics.read_metrics(
            session, job_id, name=name, since_step=since_step, limit=limit, cursor=cursor
        )
    except InvalidCursor as exc:
        raise invalid_field(("query", "cursor"), str(exc), cursor) from exc
    return page_response(rows, next_cursor)
