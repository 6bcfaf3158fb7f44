"""Request dependencies as `Annotated` aliases, so a route reads as its signature.

`SessionDep` is a session for this request (closed after the response), `CurrentOwner` the
authenticated owner (401 otherwise), `SettingsDep` the app's settings.

A route that takes `CurrentOwner` must be an `OwnerLookupRoute` (its router's
``route_class``): the token is looked up in the route's own thread, first thing
(services/api/owner_route.py); `create_app` refuses a route that is not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from services.api.auth import PendingOwner, bearer_token
from services.api.errors import Problem
from services.settings import Settings
from services.store.models import Owner

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
    pool's 30 s timeout; bench/load.py, 50 clients back to back). So sessions are taken from
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


# Declares the scheme in OpenAPI (the "Authorize" button in /docs); errors are ours (401).
bearer_scheme = HTTPBearer(auto_error=False, description="`accum token create NAME` prints one")


async def get_current_owner(
    request: Request,
    session: Annotated[Session, SessionScoped],
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> PendingOwner:
    """The bearer token, checked for form here (401 without one) and looked up on every
    request (so a revocation counts at once) on the request's session, in the route's own
    thread before its code runs (`OwnerLookupRoute`): one connection checkout, no extra hop.

    An address with too many failed token checks lately gets 429 before its token is read.
    """
    state = request.app.state
    address = request.client.host if request.client else "unknown"
    if (wait_s := state.auth_failures.retry_after(address)) is not None:
        raise Problem(
            429,
            "Too Many Requests",
            f"too many requests with a bad token from {address}; retry in {wait_s} s with a "
            "valid token (`accum token create NAME` makes one)",
            headers={"Retry-After": str(wait_s)},
            retry_after_s=wait_s,
        )
    authorization = request.headers.get("authorization")
    try:
        token = bearer_token(authorization)
    except HTTPException:
        if authorization:  # a token was tried and failed (no header at all is no guess)
            await run_in_threadpool(state.auth_failures.record_failure, address)
        raise
    pending = PendingOwner(token, session, partial(state.auth_failures.record_failure, address))
    # Parameters that fail validation skip the route, and with it the lookup: the 422 handler
    # looks the token up from here first, so a bad token still gets 401 (owner_route.py).
    request.state.pending_owner = pending
    return pending


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, SessionScoped]
# The route receives the Owner: OwnerLookupRoute resolves the PendingOwner first.
CurrentOwner = Annotated[Owner, Depends(get_current_owner)]
