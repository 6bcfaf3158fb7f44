"""Who the bearer token belongs to: the dashboard shows the name and, for admins, owners."""

from __future__ import annotations

from fastapi import APIRouter

from services.api.auth import CurrentOwner
from services.api.errors import problem_responses
from services.api.schemas import OwnerPublic

router = APIRouter(
    prefix="/v1/me",
    tags=["owners"],
    responses=problem_responses(401, 429, 503),
)


@router.get("", response_model=OwnerPublic)
async def read_me(*, owner: CurrentOwner) -> OwnerPublic:
    """The token's owner: name, and whether it is an admin (admins see every job)."""
    return OwnerPublic(name=owner.name, is_admin=owner.is_admin)
