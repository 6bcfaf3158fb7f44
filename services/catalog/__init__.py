"""The catalog's public API (torch-free): what a job may name, with which options, what trains
on what, and the listings. Callers import from here; the registry of families is
`services.catalog.families` (one module per family), names are resolved through it in
`resolve.py`.

    from services.catalog import MODELS, DATASETS, check_compatible
    MODELS["resnet18"].description; DATASETS["digits"].train_size
    check_compatible("tiny_transformer", "digits")  # -> reason string, or None when compatible
    require_model("timm:resnet18").source  # "timm"

The API process imports this to validate specs and serve `GET /v1/catalog/...`; importing it
must not import torch (tests check). Building the objects lives in `services.catalog.build`
(the worker).
"""

from services.catalog.compatibility import (
    check_compatible,
    compatible_datasets,
    compatible_models,
    mismatch,
)
from services.catalog.entries import DatasetInfo, ModelInfo, Task
from services.catalog.families import DATASETS, MODELS, OWN_DATASETS
from services.catalog.families.hf import model_path
from services.catalog.listings import datasets_listing, models_listing
from services.catalog.resolve import (
    check_options,
    configured_dataset,
    configured_model,
    require_dataset,
    require_model,
    served_names,
)

__all__ = [
    "DATASETS",
    "MODELS",
    "OWN_DATASETS",
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
    "mismatch",
    "model_path",
    "models_listing",
    "require_dataset",
    "require_model",
    "served_names",
]
