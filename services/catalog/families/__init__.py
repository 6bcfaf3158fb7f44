"""The registry of the model and dataset families a job may name, in the order names are
tried, one module each (torch-free): the built-in models and datasets, torchvision's models,
`timm:`, `hf:`, your own data, plugins. A new family is a module here and one line below;
`services.catalog.resolve` answers from these (a name with a `namespace:` prefix goes to the
family of that namespace only, any other name to the catalog families, then the plugins).
"""

from services.catalog.entries import DatasetFamily, DatasetInfo, ModelFamily, ModelInfo
from services.catalog.families import (
    builtin_datasets,
    builtin_models,
    hf,
    own_data,
    plugins,
    timm,
    torchvision,
)

MODEL_FAMILIES: tuple[ModelFamily, ...] = (
    builtin_models.FAMILY, torchvision.FAMILY, timm.FAMILY, hf.FAMILY, plugins.MODEL_FAMILY,
)
DATASET_FAMILIES: tuple[DatasetFamily, ...] = (
    builtin_datasets.FAMILY, own_data.FAMILY, plugins.DATASET_FAMILY,
)
# The catalog: the models and datasets with fixed names (plugins are read at each call).
MODELS: dict[str, ModelInfo] = {**builtin_models.BUILTIN_MODELS, **torchvision.TORCHVISION_ENTRIES}
DATASETS: dict[str, DatasetInfo] = builtin_datasets.BUILTIN_DATASETS
OWN_DATASETS: dict[str, DatasetInfo] = own_data.OWN_DATASETS
NAMESPACES = tuple(f.namespace for f in MODEL_FAMILIES if f.namespace)


def model_family(info: ModelInfo) -> ModelFamily:
    """The family an entry came from."""
    return next(f for f in MODEL_FAMILIES if f.source == info.source)


def dataset_family(info: DatasetInfo) -> DatasetFamily:
    """The family an entry came from."""
    return next(f for f in DATASET_FAMILIES if f.source == info.source)
