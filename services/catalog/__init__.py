"""Catalog of models and datasets by name: descriptions, sizes and compatibility, torch-free.

    from services.catalog import MODELS, DATASETS, check_compatible
    MODELS["resnet18"].description; DATASETS["digits"].train_size
    check_compatible("tiny_transformer", "digits")  # -> reason string, or None when compatible

The API process imports this to validate specs and serve `GET /v1/catalog/...`; importing it
must not import torch (tests check). Building the objects lives in `services.catalog.build`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from services.catalog.names import DATASETS, MODELS, DatasetInfo, ModelInfo, Task
from services.catalog.text_corpus import corpus_stats

__all__ = [
    "DATASETS",
    "MODELS",
    "DatasetInfo",
    "ModelInfo",
    "Task",
    "catalog_as_dict",
    "check_compatible",
    "check_options",
    "compatible_datasets",
    "compatible_models",
    "configured_dataset",
    "datasets_listing",
    "models_listing",
    "require_dataset",
    "require_model",
]


def _unknown(kind: str, name: object, allowed: Iterable[str]) -> ValueError:
    return ValueError(f"unknown {kind} {name!r}; allowed {kind}s: {', '.join(sorted(allowed))}")


def require_model(name: str) -> ModelInfo:
    """The catalog entry of a model, or ValueError listing the allowed names."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise _unknown("model", name, MODELS) from None


def require_dataset(name: str) -> DatasetInfo:
    """The catalog entry of a dataset, or ValueError listing the allowed names."""
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        raise _unknown("dataset", name, DATASETS) from None


def check_compatible(model: str, dataset: str) -> str | None:
    """None when `model` can train on `dataset`, else a reason that says what would work.

    Raises ValueError for names not in the catalog.
    """
    model_info, dataset_info = require_model(model), require_dataset(dataset)
    if model_info.task == dataset_info.task:
        return None
    return (
        f"model {model!r} is for {model_info.task.replace('_', ' ')} but dataset {dataset!r} is a "
        f"{dataset_info.task.replace('_', ' ')} dataset; datasets for {model!r}: "
        f"{', '.join(compatible_datasets(model))}; models for {dataset!r}: "
        f"{_summarise_models(compatible_models(dataset))}"
    )


def compatible_datasets(model: str) -> list[str]:
    """Names of the datasets `model` can train on, sorted."""
    task = require_model(model).task
    return sorted(name for name, info in DATASETS.items() if info.task == task)


def compatible_models(dataset: str) -> list[str]:
    """Names of the models that can train on `dataset`, built-ins first, then sorted."""
    task = require_dataset(dataset).task
    return [name for name, info in MODELS.items() if info.task == task]


def _summarise_models(names: list[str]) -> str:
    builtins = [n for n in names if MODELS[n].source == "builtin"]
    others = len(names) - len(builtins)
    return ", ".join(builtins) + (f" or any of {others} torchvision models" if others else "")


def check_options(kind: str, name: str, options: Mapping[str, Any]) -> str | None:
    """None when every key of `options` is accepted by model/dataset `name`, else a reason."""
    info: ModelInfo | DatasetInfo
    if kind == "model":
        info = require_model(name)
    elif kind == "dataset":
        info = require_dataset(name)
    else:
        raise ValueError(f"kind must be 'model' or 'dataset', got {kind!r}")
    unknown = sorted(set(options) - set(info.options))
    if not unknown:
        return None
    accepted = ", ".join(info.options) if info.options else "none"
    return f"{kind} {name!r} does not accept option(s) {', '.join(unknown)}; accepted options: {accepted}"


def configured_dataset(name: str, options: Mapping[str, Any] | None = None) -> DatasetInfo:
    """The catalog entry of dataset `name` with `options` applied (sizes, shapes, classes).

    This is what `build.build_dataset(name, **options)` returns as `bundle.info`, computed
    without torch, so the API can size epochs for e.g. `{"name": "fake", "size": 256}`.
    Raises ValueError for unknown names, unknown options and out-of-range values.
    """
    info = require_dataset(name)
    options = dict(options or {})
    if reason := check_options("dataset", name, options):
        raise ValueError(reason)

    def option(key: str, default: int, minimum: int) -> int:
        value = options.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(
                f"dataset {name!r} option {key} must be an integer >= {minimum}, got {value!r}"
            )
        return value

    if name == "fake":
        assert info.image_size is not None
        return replace(
            info,
            train_size=option("size", info.train_size, 1),
            val_size=option("val_size", info.val_size, 1),
            image_size=option("image_size", info.image_size, 1),
            num_classes=option("num_classes", info.num_classes, 2),
        )
    if name == "text":
        assert info.max_seq_len is not None
        max_len = option("max_len", info.max_seq_len, 2)
        stats = corpus_stats(max_len)
        return replace(
            info, train_size=stats.train_size, val_size=stats.val_size, max_seq_len=max_len
        )
    return info


def models_listing() -> list[dict[str, Any]]:
    """JSON-ready `GET /v1/catalog/models` items, in catalog order."""
    return [
        {
            "name": info.name,
            "description": info.description,
            "task": info.task,
            "source": info.source,
            "options": list(info.options),
            "min_input_size": info.min_input_size,
            "compatible_datasets": compatible_datasets(info.name),
        }
        for info in MODELS.values()
    ]


def datasets_listing() -> list[dict[str, Any]]:
    """JSON-ready `GET /v1/catalog/datasets` items, in catalog order."""
    return [
        {
            "name": info.name,
            "description": info.description,
            "task": info.task,
            "num_classes": info.num_classes,
            "train_size": info.train_size,
            "val_size": info.val_size,
            "channels": info.channels,
            "image_size": info.image_size,
            "vocab_size": info.vocab_size,
            "max_seq_len": info.max_seq_len,
            "needs_data_root": info.needs_data_root,
            "options": list(info.options),
            "compatible_models": compatible_models(info.name),
        }
        for info in DATASETS.values()
    ]


def catalog_as_dict() -> dict[str, list[dict[str, Any]]]:
    """The whole catalog as plain JSON-ready data: {"models": [...], "datasets": [...]}."""
    return {"models": models_listing(), "datasets": datasets_listing()}
