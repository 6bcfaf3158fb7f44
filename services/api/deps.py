"""Request dependencies as `Annotated` aliases, so a route reads as its signature.

`SessionDep` is a session for this request (closed after the response), `CurrentOwner` the
authenticated owner (401 otherwise), `SettingsDep` the app's settings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from services.api.auth import bearer_token, resolve_owner
from services.settings import Settings
from services.store.models import Owner

# Dependencies are `async def` where they do not block: FastAPI runs a plain `def` dependency
# in the thread pool, and each hop there costs more than these functions themselves.


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session for this request. Opening one does no I/O (it connects on first use);
    closing it may (a rollback that returns the connection), so that runs in the pool."""
    session: Session = request.app.state.session_factory()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


# Declares the scheme in OpenAPI (the "Authorize" button in /docs); errors are ours (401).
bearer_scheme = HTTPBearer(auto_error=False, description="`accum token create NAME` prints one")


async def get_current_owner(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Owner:
    """The owner of the bearer token; cached tokens cost no database round trip."""
    token = bearer_token(request.headers.get("authorization"))
    state = request.app.state
    owner = state.token_cache.get_by_token(token)
    if owner is None:
        owner = await run_in_threadpool(resolve_owner, token, state.token_cache, state.session_factory)
    return owner


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
CurrentOwner = Annotated[Owner, Depends(get_current_owner)]
