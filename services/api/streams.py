"""Live event streams held open per owner, and what keeps each one honest.

    slots = StreamSlots(settings.max_streams_per_owner)     # app.state.stream_slots
    take_slot(slots, owner.id)                               # else 429
    body = released(job_stream(...), slots, owner.id)       # the slot is freed when it ends

A stream holds a connection and polls the database for as long as a job runs, so one token
could otherwise hold thousands (1,500 made every other request 2.5x slower). The count is per
API process: with N processes an owner may hold N x the cap in all, each process protecting
itself. `token_is_live` is what an open stream re-checks every ACCUM_STREAM_TOKEN_RECHECK_S
(at most 10 s), so a revoked token stops receiving events (services/api/sse.py).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator

from sqlalchemy.orm import Session, sessionmaker

from services.api.errors import Problem
from services.jobdb.tokens import authenticate


class StreamSlots:
    """Open streams per owner id, at most `per_owner` each; thread-safe."""

    def __init__(self, per_owner: int) -> None:
        self.per_owner = per_owner
        self._open: dict[int, int] = {}
        self._lock = threading.Lock()

    def try_open(self, owner_id: int) -> bool:
        with self._lock:
            if self._open.get(owner_id, 0) >= self.per_owner:
                return False
            self._open[owner_id] = self._open.get(owner_id, 0) + 1
            return True

    def close(self, owner_id: int) -> None:
        with self._lock:
            left = self._open.get(owner_id, 0) - 1
            if left > 0:
                self._open[owner_id] = left
            else:
                self._open.pop(owner_id, None)

    def open_for(self, owner_id: int) -> int:
        return self._open.get(owner_id, 0)

    @property
    def total(self) -> int:
        """Streams open in this process (the Prometheus gauge)."""
        with self._lock:
            return sum(self._open.values())


def take_slot(slots: StreamSlots, owner_id: int) -> None:
    """Open one of the owner's stream slots, or refuse with 429 naming the cap."""
    if not slots.try_open(owner_id):
        raise Problem(
            429,
            "Too many streams",
            f"you have {slots.per_owner} event streams open (ACCUM_MAX_STREAMS_PER_OWNER); "
            "close one, or poll GET /v1/jobs/{id} instead",
            headers={"Retry-After": "5"},
            max_streams=slots.per_owner,
            open_streams=slots.open_for(owner_id),
        )


async def released(
    stream: AsyncIterator[bytes], slots: StreamSlots, owner_id: int
) -> AsyncIterator[bytes]:
    """`stream`, freeing the owner's slot when it ends: finished, failed, or the client gone
    (a disconnect cancels the response's task, which raises inside the stream's await)."""
    try:
        async for chunk in stream:
            yield chunk
    finally:
        slots.close(owner_id)


def token_is_live(session_factory: sessionmaker[Session], token: str) -> bool:
    """Whether `token` still authenticates (not revoked, its owner still there)."""
    with session_factory() as session:
        return authenticate(session, token) is not None
