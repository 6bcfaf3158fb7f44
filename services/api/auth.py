"""Bearer-token authentication: every request looks its token up, so a revoked token is
refused on the very next request, in every API process.

There is deliberately no cache of valid tokens: any cache would keep a revoked token working
until its entry expires (this used to be a 5 s cache). The lookup is one indexed read by the
token's sha256, on the request's own database session, and it is the request's first
statement, in the route's own thread (`PendingOwner`, services/api/owner_route.py): it costs
no thread hop of its own, and it stands in for the connection pool's pre-ping (a connection
the server dropped is replaced and the lookup tried once more). bench/api.py measures POST
/v1/jobs with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import HTTPException, status
from sqlalchemy.orm import Session

from services.store.db import retry_if_dropped
from services.store.models import Owner
from services.store.tokens import authenticate


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
    """The owner of `token` from the store, else 401. Runs on the request's own session, so
    the lookup costs no extra connection checkout (one indexed read by the token's sha256).

    It is the request's first statement, so it is safe to repeat: when its connection turns
    out to be one the database dropped (a restart, an idle timeout), the engine has already
    invalidated the pool's older connections and the lookup runs once more on a new one.
    A database that is really down fails again, and the request gets 503.
    """
    owner = retry_if_dropped(lambda: authenticate(session, token), before_retry=session.rollback)
    if owner is None:
        raise unauthorized(
            "invalid, unknown or revoked token; create one with `accum token create NAME`"
        )
    return owner


@dataclass(slots=True)
class PendingOwner:
    """A well-formed bearer token whose owner is not yet looked up: what `CurrentOwner`
    hands the route, replaced by the `Owner` before the route's code runs
    (services/api/owner_route.py), in the thread that runs the route."""

    token: str
    session: Session
    on_failure: Callable[[], None]  # counts the failed check against the client's address
    owner: Owner | None = None  # once looked up

    def resolve(self) -> Owner:
        """The token's owner (401 if none); blocking: call it from a worker thread."""
        try:
            self.owner = resolve_owner(self.token, self.session)
        except HTTPException:
            self.on_failure()
            raise
        return self.owner

    def resolve_in_new_session(self, sessions: Callable[[], Session]) -> Owner:
        """`resolve` on a session of its own: the request's is closed once the route is
        skipped (its parameters failed validation)."""
        with sessions() as session:
            self.session = session
            return self.resolve()
