"""Request dependencies as `Annotated` aliases, so a route reads as its signature.

`SessionDep` is a session for this request (closed when the route returns), `SettingsDep`
the app's settings. Who is asking is `services.api.auth.CurrentOwner` (401 otherwise).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from services.artifacts import ArtifactStore
from services.settings import Settings

# Dependencies are `async def` where they do not block: FastAPI runs a plain `def` dependency
# in the thread pool, and each hop there costs more than these functions themselves.


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session for this request. Opening one does no I/O (it connects on first use);
    closing it may (a rollback that returns the connection), so that runs in the pool.

    A request holds its session's connection across thread-pool hops (auth, route, close):
    with more requests in flight than the database pool has connections, the route threads
    all waited for connections that only a queued close could return (a deadlock until the
    pool's 30 s timeout; bench/service/load.py, 50 clients back to back). So sessions are taken from
    ``app.state.session_slots``, fewer than the pool's connections; a request waits for a
    slot holding nothing.
    """
    async with request.app.state.session_slots:
        session: Session = request.app.state.session_factory()
        try:
            yield session
        finally:
            if session.in_transaction():
                await run_in_threadpool(session.close)
            else:
                session.close()


# scope="function": the session (and its slot) is closed when the route returns, not after
# the response is sent: a live event stream must not hold either for hours.
SessionScoped = Depends(get_session, scope="function")


async def get_artifacts(request: Request) -> ArtifactStore:
    store: ArtifactStore = request.app.state.artifacts
    return store


SettingsDep = Annotated[Settings, Depends(get_settings)]
ArtifactsDep = Annotated[ArtifactStore, Depends(get_artifacts)]
SessionDep = Annotated[Session, SessionScoped]
