"""Bearer-token authentication with a short positive cache.

Every /v1 request needs its owner. Looking the token up costs a database round trip, which
at hundreds of requests per second is a large share of a request; a valid token is therefore
remembered for a few seconds (keyed by its sha256, so no clear token is kept in memory).
Unknown tokens are never cached, so a token created a moment ago works at once.
"""

from __future__ import annotations

import threading
import time

from fastapi import HTTPException, status
from sqlalchemy.orm import Session, sessionmaker

from services.store.models import Owner
from services.store.tokens import authenticate, hash_token

CACHE_TTL_S = 5.0
CACHE_MAX_ENTRIES = 10_000


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


class TokenCache:
    """Owners of recently seen valid tokens, by token hash, for `CACHE_TTL_S` seconds."""

    def __init__(self, ttl_s: float = CACHE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, Owner]] = {}
        self._lock = threading.Lock()

    def get(self, digest: str) -> Owner | None:
        entry = self._entries.get(digest)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def get_by_token(self, token: str) -> Owner | None:
        return self.get(hash_token(token))

    def put(self, digest: str, owner: Owner) -> None:
        with self._lock:
            if len(self._entries) >= CACHE_MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = (time.monotonic() + self.ttl_s, owner)


def resolve_owner(
    token: str, cache: TokenCache, session_factory: sessionmaker[Session]
) -> Owner:
    """The owner of `token` (cached or from the store), else 401."""
    digest = hash_token(token)
    owner = cache.get(digest)
    if owner is not None:
        return owner
    with session_factory() as session:
        owner = authenticate(session, token)
        if owner is not None:
            session.expunge(owner)  # detached: routes only read id / is_admin / name
    if owner is None:
        raise unauthorized("invalid or unknown token; create one with `accum token create NAME`")
    cache.put(digest, owner)
    return owner
