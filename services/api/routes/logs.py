"""A job's own output (what its training process printed), per attempt: the list as JSON,
or live with `Accept: text/event-stream`.

    curl -H "Authorization: Bearer $TOKEN" "$URL/v1/jobs/01jd3k5x/logs?attempt=2&after=0&limit=500"
"""

from __future__ import annotations

import functools
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from services.api.auth import CurrentOwner, bearer_token
from services.api.deps import SessionDep
from services.api.errors import problem_responses
from services.api.log_stream import LogCursor, poll_logs
from services.api.routes.jobs import NOT_FOUND, job_or_404
from services.api.schemas import MAX_INT32, LogLinePublic, LogList
from services.api.sse import SSE_HEADERS, polled_stream
from services.api.streams import StreamSlots, released, take_slot, token_is_live
from services.jobdb.job_logs import list_lines

router = APIRouter(
    prefix="/v1/jobs",
    tags=["logs"],
    responses=problem_responses(401, 422, 429, 503),
)

@router.get(
    "/{job_id}/logs",
    response_model=LogList,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "JSON list, or the live stream (log, end)",
        },
        **NOT_FOUND,
    },
)
def read_logs(
    *,
    request: Request,
    session: SessionDep,
    owner: CurrentOwner,
    job_id: str,
    attempt: Annotated[
        int | None, Query(ge=1, le=MAX_INT32, description="Only this attempt's lines (1 is the first)")
    ] = None,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_INT32, description="Only lines with a larger id")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    accept: Annotated[str | None, Header()] = None,
    last_event_id: Annotated[int | None, Header(ge=0, le=MAX_INT32)] = None,
) -> LogList | StreamingResponse:
    """Captured output oldest first; streams new lines live for an SSE client."""
    job = job_or_404(session, job_id, owner)
    if accept and "text/event-stream" in accept:
        slots: StreamSlots = request.app.state.stream_slots
        take_slot(slots, owner.id)
        # A reconnecting EventSource sends the id of the last line it saw.
        cursor = LogCursor(job.id, attempt, last_event_id if last_event_id is not None else after)
        session.close()  # the stream polls with its own sessions
        session_factory = request.app.state.session_factory
        token = bearer_token(request.headers.get("authorization"))
        stream = polled_stream(
            functools.partial(poll_logs, session_factory, cursor),
            token_live=functools.partial(token_is_live, session_factory, token),
            recheck_s=request.app.state.settings.stream_token_recheck_s,
        )
        return StreamingResponse(
            released(stream, slots, owner.id), media_type="text/event-stream", headers=SSE_HEADERS
        )
    rows = list_lines(session, job.id, attempt=attempt, after_id=after, limit=limit)
    return LogList(items=[LogLinePublic.model_validate(row) for row in rows])
