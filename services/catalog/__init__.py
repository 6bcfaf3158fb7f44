"""Catalog of models and datasets by name (torch-free; the whole of it lives in `names.py`).

    from services.catalog import MODELS, DATASETS, check_compatible
    MODELS["resnet18"].description; DATASETS["digits"].train_size
    check_compatible("tiny_transformer", "digits")  # -> reason string, or None when compatible

The API process imports this to validate specs and serve `GET /v1/catalog/...`; importing it
must not import torch (tests check). Building the objects lives in `services.catalog.build`.
"""

from services.catalog.names import (
    DATASETS,
    MODELS,
    DatasetInfo,
    ModelInfo,
    Task,
    check_compatible,
    check_options,
    compatible_datasets,
    compatible_models,
    configured_dataset,
    configured_model,
    datasets_listing,
    models_listing,
    require_dataset,
    require_model,
)

__all__ = [
    "DATASETS",
    "MODELS",
    "DatasetInfo",
    "ModelInfo",
    "Task",
    "check_compatible",
    "check_options",
    "compatible_datasets",
    "compatible_models",
    "configured_dataset",
    "configured_model",
    "datasets_listing",
    "models_listing",
    "require_dataset",
    "require_model",
]
