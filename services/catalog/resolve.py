"""A name to its entry through the registry of families (`services.catalog.families`)
(torch-free): which entry a name is, which options it takes, what this node serves.

    require_model("timm:resnet18").source         # "timm"
    configured_dataset("files", {"data_files": "train.jsonl", "tokenizer": "bytes"}).task
    served_names("model")   # what an unknown name's error lists

The families are tried in order (`MODEL_FAMILIES`, `DATASET_FAMILIES`): a name with a
`namespace:` prefix goes to the family of that namespace only, any other name to the catalog
families and then the plugins. The API checks a spec's names here (so it stays without torch,
timm or transformers); the deeper checks (a timm name timm does not know, a Hugging Face config
option of the wrong type, a column missing from a file) need the libraries and the data, so
the worker makes them when it builds the job, before any step (`services.catalog.build`).
`served_names` is the one place that says what this node serves: a worker registry can
replace it with what the live workers advertise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.catalog.entries import DatasetFamily, DatasetInfo, ModelFamily, ModelInfo, NameRefused
from services.catalog.families import (
    DATASET_FAMILIES,
    MODEL_FAMILIES,
    NAMESPACES,
    dataset_family,
    model_family,
)
from services.catalog.option_types import undeclared


def served_names(kind: str) -> list[str]:
    """What a `model` or `dataset` name may be on this node: the catalog's names, then the
    namespace patterns, then the plugins' names. Unknown names are refused listing these."""
    families: tuple[ModelFamily | DatasetFamily, ...] = MODEL_FAMILIES if kind == "model" else DATASET_FAMILIES
    catalog = sorted(n for f in families if f.naming == "catalog" for n in f.names())
    patterns = [p for f in families if isinstance(f, ModelFamily) for p in f.patterns]
    return [*catalog, *patterns, *sorted(n for f in families if f.naming == "plugin" for n in f.names())]


def _unknown(kind: str, name: object, detail: str = "") -> ValueError:
    return ValueError(f"unknown {kind} {name!r}{detail}; allowed {kind}s: {', '.join(served_names(kind))}")


def require_model(name: str) -> ModelInfo:
    """The entry of a model name, or ValueError listing what this node serves."""
    if not isinstance(name, str):
        raise _unknown("model", name)
    namespace, sep, _ = name.partition(":")
    if sep and namespace not in NAMESPACES:
        raise _unknown("model", name, f" (namespace {namespace!r} is not one of: {', '.join(NAMESPACES)})")
    for family in MODEL_FAMILIES:
        if family.namespace == (namespace if sep else None):
            try:
                info = family.find(name)
            except NameRefused as exc:
                raise _unknown("model", name, str(exc)) from None
            if info is not None:
                return info
    raise _unknown("model", name)


def require_dataset(name: str) -> DatasetInfo:
    """The entry of a dataset name, or ValueError listing what this node serves."""
    if isinstance(name, str):
        for family in DATASET_FAMILIES:
            if (info := family.find(name)) is not None:
                return info
    raise _unknown("dataset", name)


def check_options(kind: str, name: str, options: Mapping[str, Any]) -> str | None:
    """None when every key of `options` is accepted by model/dataset `name`, else a reason."""
    if kind == "model":
        return undeclared(kind, name, options, require_model(name).options)
    if kind == "dataset":
        return undeclared(kind, name, options, require_dataset(name).options)
    raise ValueError(f"kind must be 'model' or 'dataset', got {kind!r}")


def configured_model(name: str, options: Mapping[str, Any] | None = None) -> ModelInfo:
    """The entry of model `name` once its family checked `options` (as far as it can without
    the libraries): the checks `build.build_model` makes again before building, so the API
    refuses at submit what a worker would refuse at start. Raises ValueError (OptionError for
    a typed family, naming the key) for unknown names, unknown options and bad values."""
    info = require_model(name)
    return model_family(info).configure(info, dict(options or {}))


def configured_dataset(name: str, options: Mapping[str, Any] | None = None) -> DatasetInfo:
    """The entry of dataset `name` with `options` applied by its family (sizes, shapes,
    classes, the task of own data): what `build.build_dataset(name, **options)` returns as
    `bundle.info`, without torch, so the API can size epochs. Own data and plugins have no
    sizes until a worker reads them (None). Raises ValueError when refused."""
    info = require_dataset(name)
    return dataset_family(info).configure(info, dict(options or {}))
