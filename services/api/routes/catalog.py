"""The catalog: model and dataset names a spec may use, with descriptions and compatibility."""

from __future__ import annotations

from fastapi import APIRouter

from services.api.auth import CurrentOwner
from services.api.errors import problem_responses
from services.api.schemas import CatalogList
from services.catalog import datasets_listing, models_listing

router = APIRouter(
    prefix="/v1/catalog",
    tags=["catalog"],
    responses=problem_responses(401, 429, 503),
)


@router.get("/models", response_model=CatalogList)
async def list_models(*, _owner: CurrentOwner) -> CatalogList:
    """Models by name: task, options, and the datasets each can train on."""
    return CatalogList(items=models_listing())


@router.get("/datasets", response_model=CatalogList)
async def list_datasets(*, _owner: CurrentOwner) -> CatalogList:
    """Datasets by name: sizes, shapes, and the models that can train on each."""
    return CatalogList(items=datasets_listing())
