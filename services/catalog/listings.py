"""The JSON-ready items of `GET /v1/catalog/models` and `GET /v1/catalog/datasets`
(torch-free): each family's items, in the registry's order."""

from __future__ import annotations

from typing import Any

from services.catalog.compatibility import compatible_datasets, compatible_models
from services.catalog.families import DATASET_FAMILIES, MODEL_FAMILIES


def models_listing() -> list[dict[str, Any]]:
    """The catalog's models, then the namespaces (`timm:`, `hf:`), then the plugins."""
    return [item for family in MODEL_FAMILIES for item in family.listing(compatible_datasets)]


def datasets_listing() -> list[dict[str, Any]]:
    """The catalog's datasets, then your own data, then the plugins."""
    return [item for family in DATASET_FAMILIES for item in family.listing(compatible_models)]
