"""Catalog of models and datasets by name (torch-free): the built-in catalog lives in
`names.py`; what a job may name on this node (the catalog, `timm:`/`hf:` models, your own
data, plugins) in `served.py`, whose functions are the ones exported here.

    from services.catalog import MODELS, DATASETS, check_compatible
    MODELS["resnet18"].description; DATASETS["digits"].train_size
    check_compatible("tiny_transformer", "digits")  # -> reason string, or None when compatible
    require_model("timm:resnet18").source  # "timm"

The API process imports this to validate specs and serve `GET /v1/catalog/...`; importing it
must not import torch (tests check). Building the objects lives in `services.catalog.build`.
"""

from services.catalog.names import DATASETS, MODELS, DatasetInfo, ModelInfo, Task
from services.catalog.served import (
    OWN_DATASETS,
    check_compatible,
    check_options,
    compatible_datasets,
    compatible_models,
    configured_dataset,
    configured_model,
    datasets_listing,
    model_path,
    models_listing,
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
    "model_path",
    "models_listing",
    "require_dataset",
    "require_model",
    "served_names",
]
