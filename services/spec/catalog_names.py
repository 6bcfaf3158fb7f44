"""What the spec needs from the catalog: names, compatibility, options, training-set sizes.

Reads `accumcore.catalog`, the torch-free half of the catalog, so the API process that
validates specs never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accumcore import catalog


def model_names() -> list[str]:
    return sorted(catalog.MODELS)


def dataset_names() -> list[str]:
    return sorted(catalog.DATASETS)


def incompatibility(model: str, dataset: str) -> str | None:
    """Why `model` cannot train on `dataset` (naming what would work), or None when it can."""
    return catalog.check_compatible(model, dataset)


def compatible_datasets(model: str) -> list[str]:
    return catalog.compatible_datasets(model)


def declared_options(kind: str, name: str) -> list[str]:
    """The option names a catalog model or dataset accepts next to its name."""
    entry = catalog.MODELS[name] if kind == "model" else catalog.DATASETS[name]
    return list(entry.options)


def option_problem(kind: str, name: str, options: Mapping[str, Any]) -> str | None:
    """Why `options` are not accepted by catalog entry `name` (listing the accepted ones), or None."""
    return catalog.check_options(kind, name, options)


def train_size(dataset: str, options: Mapping[str, Any] | None = None) -> int:
    """Samples in the dataset's training split (one epoch) with these options.

    `catalog.configured_dataset` applies the options as `build_dataset` does, without torch;
    raises ValueError for options it rejects.
    """
    return catalog.configured_dataset(dataset, options).train_size
