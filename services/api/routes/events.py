"""A job's lifecycle events: the list as JSON, or live with `Accept: text/event-stream`."""

from __future__ import annotations

import functools
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from services.api.auth import CurrentOwner, bearer_token
from services.api.deps import SessionDep
from services.api.errors import problem_responses
from services.api.routes.jobs import NOT_FOUND, job_or_404, owner_names
from services.api.schemas import MAX_INT32, EventList, EventPublic
from services.api.sse import SSE_HEADERS, job_stream, open_stream
from services.api.streams import StreamSlots, released, take_slot, token_is_live
from services.jobdb import events as store_events

router = APIRouter(
    prefix="/v1/jobs",
    tags=["events"],
    responses=problem_responses(401, 422, 429, 503),
)

@router.get(
    "/{job_id}/events",
    response_model=EventList,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "JSON list, or the live stream (job_event, metric, status, end)",
        },
        **NOT_FOUND,
    },
)
def read_events(
    *,
    request: Request,
    session: SessionDep,
    owner: CurrentOwner,
    job_id: str,
    after_id: Annotated[
        int | None, Query(ge=0, le=MAX_INT32, description="Only events with a larger id")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    accept: Annotated[str | None, Header()] = None,
    last_event_id: Annotated[int | None, Header(ge=0, le=MAX_INT32)] = None,
) -> EventList | StreamingResponse:
    """Lifecycle events oldest first; streams them live, with metrics, for an SSE client."""
    job = job_or_404(session, job_id, owner)
    job_id = job.id  # the path may hold a prefix of it
    if accept and "text/event-stream" in accept:
        slots: StreamSlots = request.app.state.stream_slots
        take_slot(slots, owner.id)
        try:
            state = open_stream(session, job, owner_names(session, owner, [job]).get(job.owner_id))
        except BaseException:
            slots.close(owner.id)
            raise
        # A reconnecting EventSource sends the id of the last event it saw.
        state.last_event_id = last_event_id if last_event_id is not None else after_id
        session.close()  # return the connection now: the stream polls with its own sessions
        session_factory, settings = request.app.state.session_factory, request.app.state.settings
        token = bearer_token(request.headers.get("authorization"))
        stream = job_stream(
            session_factory,
            job_id,
            state,
            token_live=functools.partial(token_is_live, session_factory, token),
            recheck_s=settings.stream_token_recheck_s,
        )
        return StreamingResponse(
            released(stream, slots, owner.id), media_type="text/event-stream", headers=SSE_HEADERS
        )
    rows = store_events.list_events(session, job_id, after_id=after_id, limit=limit)
    return EventList(items=[EventPublic.model_validate(e) for e in rows])
