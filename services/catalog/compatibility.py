"""What trains on what (torch-free): a model's task against a dataset's, as configured at
submit or as built on the worker, with a reason that says what would work."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.catalog.entries import DatasetInfo, ModelInfo
from services.catalog.families import DATASETS, MODELS, OWN_DATASETS
from services.catalog.resolve import configured_dataset, require_dataset, require_model

_CATALOG_SOURCES = ("builtin", "torchvision")


def check_compatible(model: str, dataset: str, dataset_options: Mapping[str, Any] | None = None) -> str | None:
    """None when `model` can train on `dataset` (with its options), else a reason that says
    what would work. Raises ValueError for names this node does not serve."""
    dataset_info = configured_dataset(dataset, dataset_options) if dataset_options else require_dataset(dataset)
    return mismatch(require_model(model), dataset_info)


def mismatch(model: ModelInfo, dataset: DatasetInfo) -> str | None:
    """None when `model` can train on `dataset` (as configured or as built), else a reason
    that says what would work."""
    if dataset.text_classification and model.source != "plugin" and model.task is not None:
        return (
            f"dataset {dataset.name!r} with text and label columns is sequence classification, which "
            f"model {model.name!r} cannot read (token ids): use an hf: model such as hf:bert or hf:gpt2 "
            "(built as AutoModelForSequenceClassification), a saved hf:<directory>, or a plugin"
        )
    if model.task is None or dataset.source == "plugin" or model.task == dataset.task:
        return None
    said = (f"model {model.name!r} is for {model.task.replace('_', ' ')} but dataset {dataset.name!r} is a "
            f"{dataset.task.replace('_', ' ')} dataset")
    if model.source in _CATALOG_SOURCES and dataset.source == "builtin":
        catalog_datasets = sorted(n for n, info in DATASETS.items() if info.task == model.task)
        return (f"{said}; datasets for {model.name!r}: {', '.join(catalog_datasets)}; models for "
                f"{dataset.name!r}: {_summarise_models(compatible_models(dataset.name))}")
    return f"{said} here; datasets for {model.name!r}: {', '.join(compatible_datasets(model.name))}"


def compatible_datasets(model: str) -> list[str]:
    """Names of the datasets `model` can train on, sorted: own data with any column mapping
    that fits it (`files` with features and label for `mlp`; `mismatch` checks the one given)."""
    task = require_model(model).task
    every = {**DATASETS, **OWN_DATASETS}
    return sorted(n for n, info in every.items() if task is None or task in info.possible_tasks)


def compatible_models(dataset: str) -> list[str]:
    """Names of the catalog models that can train on `dataset` (with some column mapping, for
    own data), built-ins first."""
    tasks = require_dataset(dataset).possible_tasks
    return [name for name, info in MODELS.items() if info.task in tasks]


def _summarise_models(names: list[str]) -> str:
    builtins = [n for n in names if MODELS[n].source == "builtin"]
    others = len(names) - len(builtins)
    return ", ".join(builtins) + (f" or any of {others} torchvision models" if others else "")
