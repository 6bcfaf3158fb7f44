"""API tokens over HTTP: list yours, revoke one (a leaked one, or to log out); admins make them.

The same scoping as jobs: an owner sees and revokes only its own tokens (another owner's
prefix is 404, as if it did not exist); an admin sees and revokes everyone's. Only an admin
makes tokens (for itself or for any owner, created if new): a leaked owner token could
otherwise mint fresh ones and outlive its own revocation. A token is never shown again after
it is made: listings carry its 12-character prefix only, and a revoked token keeps its row
(`revoked_at`) as an audit trail.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, HTTPException, Path, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from services.api.auth import CurrentOwner
from services.api.deps import SessionDep
from services.api.errors import problem_responses
from services.api.schemas import TokenCreated, TokenList, TokenPublic
from services.jobdb import tokens as store_tokens

router = APIRouter(
    prefix="/v1/tokens",
    tags=["tokens"],
    responses=problem_responses(401, 422, 429, 503),
)

Prefix = Annotated[
    str,
    Path(
        pattern=rf"^[A-Za-z0-9_-]{{{store_tokens.PREFIX_LENGTH}}}$",
        description="The token's 12-character prefix, as GET /v1/tokens lists it",
    ),
]


class TokenRequest(BaseModel):
    # An unknown field is a mistake to report, not to drop: `{"admin": true}` was once
    # answered 201 with a plain owner's token.
    model_config = ConfigDict(extra="forbid")

    owner: str | None = Field(
        None,
        pattern=rf"^{store_tokens.OWNER_NAME_PATTERN}$",
        description="Whose token (created if new): 1 to 64 letters, digits, '.', '_' or '-'; "
        "default: yours",
    )


@router.get("", response_model=TokenList)
def list_tokens(
    *,
    session: SessionDep,
    owner: CurrentOwner,
    include_revoked: Annotated[bool, Query(description="Revoked tokens too")] = False,
) -> TokenList:
    """Your live tokens, oldest first (an admin: everyone's)."""
    rows = store_tokens.list_tokens(
        session, None if owner.is_admin else owner.name, include_revoked=include_revoked
    )
    return TokenList(
        items=[
            TokenPublic(
                owner=name, prefix=prefix, created_at=created, revoked_at=revoked, last_used_at=used
            )
            for name, prefix, created, revoked, used in rows
        ]
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=TokenCreated,
    responses=problem_responses(400, (403, "Only an admin makes tokens"), 413),
)
def create_token(
    *,
    session: SessionDep,
    owner: CurrentOwner,
    response: Response,
    request: Annotated[TokenRequest | None, Body()] = None,
) -> TokenCreated:
    """A new token for you or for `owner` (admins only); the answer is the only time it is
    shown."""
    if not owner.is_admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail="only an admin makes tokens (a leaked token must not mint new ones); ask "
            "yours, or run `accum token create NAME` with database access",
        )
    name = (request.owner if request and request.owner else owner.name).strip()
    _, token = store_tokens.create_owner_with_token(session, name)
    created_at = store_tokens.created_at(session, token)
    session.commit()
    assert created_at is not None  # written just above, in this transaction
    response.headers["Cache-Control"] = "no-store"  # the token must not sit in a cache
    prefix = token[: store_tokens.PREFIX_LENGTH]
    return TokenCreated(owner=name, prefix=prefix, created_at=created_at, token=token)


@router.delete(
    "/{prefix}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problem_responses(
        (404, "No live token with this prefix (or not yours)"),
        (409, "Two live tokens share this prefix: revoke with `accum token revoke TOKEN`"),
    ),
)
def revoke_token(*, session: SessionDep, owner: CurrentOwner, prefix: Prefix) -> Response:
    """Revoke a token by its prefix: the next request that presents it gets 401. Revoking
    the token this request carries logs you out."""
    try:
        revoked = store_tokens.revoke_token(
            session, prefix, owner_id=None if owner.is_admin else owner.id
        )
    except ValueError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    if not revoked:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"no live token {prefix!r} of yours; GET /v1/tokens lists them",
        )
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)
