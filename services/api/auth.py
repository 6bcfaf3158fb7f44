"""Bearer-token authentication: `CurrentOwner` is the owner of the request's token.

    @router.get("/{job_id}")
    def read_job(*, session: SessionDep, owner: CurrentOwner, job_id: str) -> JobPublic: ...

Every request looks its token up, so a revoked token is refused on the very next request, in
every API process. There is deliberately no cache of valid tokens: any cache would keep a
revoked token working until its entry expires (this used to be a 5 s cache). The lookup is one
indexed read by the token's sha256 on the request's own session (no connection checkout of
its own), and it is the request's first statement, so it stands in for the pool's pre-ping: a
connection the server dropped is replaced and the lookup tried once more.

What a request gets, in order: 401 for a missing, malformed, unknown or revoked token (429
instead when its address or its token prefix sent too many bad tokens lately:
services/api/auth_failures.py; a valid token is never refused so), and only then a 422 for its
parameters or body: FastAPI solves a route's
dependencies before it validates the route's own parameters, and the first dependency that
raises answers. (A body that is not JSON at all is answered 400 before any dependency runs.)

`get_current_owner` is a plain `def`, so FastAPI runs it in the thread pool: one hop more per
request than looking the token up inside the route's own hop, which an `APIRoute` subclass
did until bench/notes.md ("One plain CurrentOwner dependency") measured the difference.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from services.api.deps import SessionDep
from services.api.errors import Problem
from services.jobdb.db import retry_if_dropped
from services.jobdb.models import Owner
from services.jobdb.tokens import PREFIX_LENGTH, TOUCHED, authenticate

# The client address (request.client, set by uvicorn's ProxyHeadersMiddleware in main.py)
# keys the failure counts. When every hop is trusted it is the first one in X-Forwarded-For,
# which the client may have written: capped, so a long one cannot bloat the limiter's keys.
MAX_ADDRESS_LENGTH = 64

# Declares the scheme in OpenAPI (the "Authorize" button in /docs); errors are ours (401).
bearer_scheme = HTTPBearer(auto_error=False, description="`accum token create NAME` prints one")


def unauthorized(detail: str) -> HTTPException:
    """401 with the challenge header RFC 6750 asks for."""
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"}
    )


def bearer_token(authorization: str | None) -> str:
    """The token in an `Authorization: Bearer <token>` header; 401 saying what is wrong."""
    if not authorization:
        raise unauthorized(
            "missing Authorization header; send `Authorization: Bearer <token>` "
            "(create a token with `accum token create NAME`)"
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("Authorization header must be `Bearer <token>`")
    return token.strip()


def resolve_owner(token: str, session: Session) -> Owner:
    """The owner of `token` from the store, else 401.

    The request's first statement, so it is safe to repeat: when its connection turns out to
    be one the database dropped (a restart, an idle timeout), the engine has already
    invalidated the pool's older connections and the lookup runs once more on a new one.
    A database that is really down fails again, and the request gets 503.
    """
    owner = retry_if_dropped(lambda: authenticate(session, token), before_retry=session.rollback)
    if owner is None:
        raise unauthorized(
            "invalid, unknown or revoked token; create one with `accum token create NAME`"
        )
    if session.info.pop(TOUCHED, False):
        _commit_last_used(session)
    return owner


def _commit_last_used(session: Session) -> None:
    """Commit the token's new `last_used_at` (at most once a minute per token). A busy or
    failing database must not fail the request for a display field: roll it back instead."""
    try:
        session.commit()
    except SQLAlchemyError:
        session.rollback()


def failure_keys(address: str, token: str | None) -> list[str]:
    """What a failed token check counts against: the client address and, when a token was
    presented, its prefix (so guesses at one token are limited from every address, and
    a changing X-Forwarded-For does not escape the count)."""
    keys = [f"address:{address}"]
    if token is not None:
        keys.append(f"token:{token[:PREFIX_LENGTH]}")
    return keys


def too_many_bad_tokens(wait_s: int) -> Problem:
    return Problem(
        429,
        "Too Many Requests",
        f"too many requests with a bad token from this address or for this token prefix; "
        f"retry in {wait_s} s with a valid token (`accum token create NAME` makes one)",
        headers={"Retry-After": str(wait_s)},
        retry_after_s=wait_s,
    )


def get_current_owner(
    request: Request,
    session: SessionDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Owner:
    """The owner of the request's bearer token (401 otherwise), looked up on every request.

    A valid token always passes. A bad one gets 429 instead of 401 while its address, or its
    prefix, has had too many failures lately (services/api/auth_failures.py): one address
    (a NAT, a proxy) sending bad tokens cannot lock out the valid users behind it."""
    limiter = request.app.state.auth_failures
    address = request.client.host[:MAX_ADDRESS_LENGTH] if request.client else "unknown"
    authorization = request.headers.get("authorization")
    token: str | None = None
    try:
        token = bearer_token(authorization)
        return resolve_owner(token, session)
    except HTTPException:
        if not authorization:  # no header at all is no guess
            raise
        keys = failure_keys(address, token)
        waits = [w for w in map(limiter.retry_after, keys) if w is not None]
        telemetry = request.app.state.telemetry
        if waits:  # blocked: answered without counting, so a blocked key frees in time
            telemetry.auth_failures.labels(answer="429").inc()
            raise too_many_bad_tokens(max(waits)) from None
        telemetry.auth_failures.labels(answer="401").inc()
        for key in keys:
            limiter.record_failure(key)
        raise


CurrentOwner = Annotated[Owner, Depends(get_current_owner)]
