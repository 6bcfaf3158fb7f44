"""Who the bearer token belongs to: the dashboard shows the name and, for admins, owners and
the allowed data roots."""

from __future__ import annotations

from fastapi import APIRouter

from services.api.auth import CurrentOwner
from services.api.deps import SettingsDep
from services.api.errors import problem_responses
from services.api.schemas import OwnerPublic
from services.data_roots import configured_data_roots

router = APIRouter(
    prefix="/v1/me",
    tags=["owners"],
    responses=problem_responses(401, 429, 503),
)


@router.get("", response_model=OwnerPublic)
async def read_me(*, owner: CurrentOwner, settings: SettingsDep) -> OwnerPublic:
    """The token's owner: name, whether it is an admin (admins see every job), and for admins
    the directories a job's data_root may name."""
    roots = configured_data_roots(settings) if owner.is_admin else None
    return OwnerPublic(name=owner.name, is_admin=owner.is_admin, data_roots=roots)
