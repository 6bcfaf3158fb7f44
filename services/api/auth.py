"""Bearer-token authentication: every request looks its token up, so a revoked token is
refused on the very next request, in every API process.

There is deliberately no cache of valid tokens: any cache would keep a revoked token working
until its entry expires (this used to be a 5 s cache). The lookup is one indexed read by the
token's sha256, on the request's own database session; bench/api.py measures what it costs
on POST /v1/jobs.
"""

from __future__ import annotations

from fastapi import HTTPException, status
from sqlalchemy.orm import Session

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
    the lookup costs no extra connection checkout (one indexed read by the token's sha256)."""
    owner = authenticate(session, token)
    if owner is None:
        raise unauthorized(
            "invalid, unknown or revoked token; create one with `accum token create NAME`"
        )
    return owner
