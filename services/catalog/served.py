"""What a job may name (torch-free): the built-in catalog (`names.py`), the model namespaces
`timm:` and `hf:`, your own data (`imagefolder`, `files`, `hf_disk`) and installed plugins.

    require_model("timm:resnet18").source         # "timm"
    configured_dataset("files", {"data_files": "train.jsonl", "tokenizer": "bytes"}).task
    served_names("model")   # what an unknown name's error lists

The API checks a spec's names here (so it stays without torch, timm or transformers); the
deeper checks (a timm name timm does not know, a Hugging Face config option of the wrong type,
a column missing from a file) need the libraries and the data, so the worker makes them when
it builds the job, before any step (`services.catalog.build`). `served_names` is the one place
that says what this node serves: a worker registry can replace it with what the live workers
advertise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from services.catalog import names, plugins
from services.catalog.family_options import HF_CONFIG_OPTIONS, TIMM_OPTIONS
from services.catalog.names import DatasetInfo, ModelInfo
from services.catalog.option_types import Option, OptionError, check_declared

MODEL_NAMESPACES = {
    "timm": (
        "timm:<name>: any timm model (timm.list_models()), randomly initialised; pretrained: true "
        "loads the node's cached weights or `weights` (a file under a data root); options: "
        f"{', '.join(TIMM_OPTIONS)}"
    ),
    "hf": (
        "hf:<model_type>: a Hugging Face transformers model built from its config class, the "
        "listed options override the config; hf:<directory under a data root>: a saved model "
        "(no options)"
    ),
}
_TIMM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_HF_MODEL_TYPE = re.compile(r"[a-z0-9][a-z0-9_\-]*")

IMAGEFOLDER_OPTIONS = (
    "image_size", "random_resized_crop", "horizontal_flip", "mean", "std", "val_fraction",
)
TEXT_OPTIONS = ("columns", "tokenizer", "max_len", "packing", "val_fraction")
HF_DISK_OPTIONS = (*TEXT_OPTIONS, "image_size")
FILES_OPTIONS = ("data_files", "format", *TEXT_OPTIONS, "image_size")
COLUMN_ROLES = ("text", "image", "label", "features")
# What each column mapping trains (`GET /v1/catalog/datasets` lists it for files and hf_disk).
COLUMN_MAPPINGS = {
    '{"text": "body"}': "language modelling: a causal LM (hf:<model_type>, tiny_transformer) "
                        "on the tokenised text, packed into max_len blocks or padded",
    '{"text": "body", "label": "y"}': "sequence classification: an hf: model "
                                      "(AutoModelForSequenceClassification, num_labels from the "
                                      "data) on one padded row per document with its attention "
                                      "mask; items are the examples",
    '{"image": "img", "label": "y"}': "image classification (timm:, hf:, catalog CNNs)",
    '{"features": ["a", "b"], "label": "y"}': "classification of feature vectors (mlp)",
}
FILE_FORMATS = ("parquet", "json", "csv")
DEFAULT_COLUMNS = {"text": "text"}
DEFAULT_IMAGE_SIZE = 224
DEFAULT_MAX_LEN = 128
MAX_TEXT_LEN = 65536
MAX_IMAGE_SIZE = 4096

def _own(name: str, description: str, task: Any, options: tuple[str, ...], **shape: Any) -> DatasetInfo:
    """An own-data entry: no size or classes until the worker reads the data."""
    return DatasetInfo(name=name, description=description, task=task, num_classes=None,
                       train_size=None, val_size=None, needs_data_root=True, options=options,
                       source="own", **shape)


OWN_DATASETS: dict[str, DatasetInfo] = {
    "imagefolder": _own(
        "imagefolder",
        "Your images: one sub-folder per class at data_root (train/ and val/ when present, "
        "else a val_fraction split by the seed).",
        "classification", IMAGEFOLDER_OPTIONS, channels=3, image_size=DEFAULT_IMAGE_SIZE,
    ),
    "files": _own(
        "files",
        "Your parquet, jsonl or csv files under data_root (Hugging Face datasets) with a "
        "column mapping: text trains a language model (tokenised, packed or padded), text and "
        "label a sequence classifier, image or features and label a classifier.",
        "language_modeling", FILES_OPTIONS, max_seq_len=DEFAULT_MAX_LEN,
    ),
    "hf_disk": _own(
        "hf_disk",
        "A Hugging Face dataset saved with save_to_disk at data_root, with a column mapping "
        "(as files: text, text and label, image and label, features and label).",
        "language_modeling", HF_DISK_OPTIONS, max_seq_len=DEFAULT_MAX_LEN,
    ),
}


def served_names(kind: str) -> list[str]:
    """What a `model` or `dataset` name may be on this node: the catalog's names, then the
    namespace patterns, then the plugins' names. Unknown names are refused listing these."""
    if kind == "model":
        return [*sorted(names.MODELS), "timm:<name>", "hf:<model_type>", "hf:<directory>",
                *sorted(plugins.installed(plugins.MODEL_GROUP))]
    return [*sorted([*names.DATASETS, *OWN_DATASETS]), *sorted(plugins.installed(plugins.DATASET_GROUP))]


def _unknown(kind: str, name: object, detail: str = "") -> ValueError:
    return ValueError(
        f"unknown {kind} {name!r}{detail}; allowed {kind}s: {', '.join(served_names(kind))}"
    )


def require_model(name: str) -> ModelInfo:
    """The entry of a model name, or ValueError listing what this node serves."""
    if not isinstance(name, str):
        raise _unknown("model", name)
    if name in names.MODELS:
        return names.MODELS[name]
    namespace, sep, rest = name.partition(":")
    if sep and namespace == "timm":
        if not _TIMM_NAME.fullmatch(rest):
            raise _unknown("model", name, " (a timm name is letters, digits, '_', '.', '-')")
        return ModelInfo(name=name, description=f"timm model {rest}", task="classification",
                         source="timm", options=tuple(TIMM_OPTIONS))
    if sep and namespace == "hf":
        if rest.startswith("/"):
            return ModelInfo(name=name, description=f"Hugging Face model saved in {rest}",
                             task=None, source="hf")
        if not _HF_MODEL_TYPE.fullmatch(rest):
            raise _unknown("model", name, " (hf: takes a model_type such as gpt2, or an absolute directory)")
        return ModelInfo(name=name, description=f"Hugging Face {rest} from its config", task=None,
                         source="hf", options=tuple(HF_CONFIG_OPTIONS))
    if sep and namespace not in MODEL_NAMESPACES:
        raise _unknown("model", name, f" (namespace {namespace!r} is not one of: {', '.join(MODEL_NAMESPACES)})")
    entry = plugins.installed(plugins.MODEL_GROUP).get(name)
    if entry is None:
        raise _unknown("model", name)
    return ModelInfo(name=name, description=plugins.describe(entry), task=None, source="plugin",
                     options=tuple(plugins.declared_options(plugins.MODEL_GROUP, name)))


def require_dataset(name: str) -> DatasetInfo:
    """The entry of a dataset name, or ValueError listing what this node serves."""
    if isinstance(name, str):
        if name in names.DATASETS:
            return names.DATASETS[name]
        if name in OWN_DATASETS:
            return OWN_DATASETS[name]
        entry = plugins.installed(plugins.DATASET_GROUP).get(name)
        if entry is not None:
            return DatasetInfo(
                name=name, description=plugins.describe(entry), task="classification",
                num_classes=None, train_size=None, val_size=None, source="plugin",
                options=tuple(plugins.declared_options(plugins.DATASET_GROUP, name)),
            )
    raise _unknown("dataset", name)


def model_path(name: str) -> str | None:
    """The directory an `hf:/...` model is loaded from (checked against the data roots)."""
    return name[3:] if name.startswith("hf:/") else None


def check_options(kind: str, name: str, options: Mapping[str, Any]) -> str | None:
    """None when every key of `options` is accepted by model/dataset `name`, else a reason."""
    if kind == "model":
        return _refused(kind, name, options, require_model(name).options)
    if kind == "dataset":
        return _refused(kind, name, options, require_dataset(name).options)
    raise ValueError(f"kind must be 'model' or 'dataset', got {kind!r}")


def _refused(kind: str, name: str, options: Mapping[str, Any], accepted: tuple[str, ...]) -> str | None:
    unknown = sorted(set(options) - set(accepted))
    if not unknown:
        return None
    shown = ", ".join(accepted) if accepted else "none"
    return f"{kind} {name!r} does not accept option(s) {', '.join(unknown)}; accepted options: {shown}"


def configured_model(name: str, options: Mapping[str, Any] | None = None) -> ModelInfo:
    """The entry of model `name` once `options` are checked (as far as it can be without the
    libraries). Raises ValueError for unknown names, unknown options and bad values."""
    info = require_model(name)
    if info.source in ("builtin", "torchvision"):
        return names.configured_model(name, options)
    options = dict(options or {})
    check_declared(f"model {name!r}", options, declared_options("model", name))
    if "weights" in options and options.get("pretrained") is not True:
        raise OptionError("weights", f"model {name!r} option weights needs pretrained: true")
    return info


def declared_options(kind: str, name: str) -> dict[str, Option]:
    """The typed allow-list of a `timm:`, `hf:` or plugin model, or of a plugin dataset
    (`family_options.py`, a plugin's declaration); `hf:<directory>` accepts none."""
    if kind == "model":
        info = require_model(name)
        if info.source == "timm":
            return TIMM_OPTIONS
        if info.source == "hf":
            return {} if model_path(name) else HF_CONFIG_OPTIONS
        return plugins.declared_options(plugins.MODEL_GROUP, name)
    return plugins.declared_options(plugins.DATASET_GROUP, name)


def _fraction(name: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"dataset {name!r} option {key} must be a number between 0 and 1 (exclusive); got {value!r}")
    return float(value)


def _integer(name: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"dataset {name!r} option {key} must be an integer from {low} to {high}; got {value!r}")
    return value


def _flag(name: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"dataset {name!r} option {key} must be true or false; got {value!r}")
    return value


def _relative_path(name: str, key: str, value: Any) -> str:
    """A path under the job's data_root: relative, no `..` (so the data_root check covers it)."""
    if not isinstance(value, str) or not value or value.startswith(("/", "~")) or ".." in value.split("/"):
        raise ValueError(
            f"dataset {name!r} option {key} must be a path relative to data_root, without '..'; got {value!r}"
        )
    return value


def _data_files(name: str, value: Any) -> None:
    if isinstance(value, Mapping):
        if not value or set(value) - {"train", "val"} or "train" not in value:
            raise ValueError(
                f'dataset {name!r} option data_files as a mapping needs "train" and may have "val" '
                f"(nothing else); got keys {sorted(value)}"
            )
        for part in value.values():
            _data_files(name, part)
        return
    parts = value if isinstance(value, list) and value else [value]
    for part in parts:
        _relative_path(name, "data_files", part)


def columns_of(options: Mapping[str, Any]) -> dict[str, Any]:
    """The column mapping (role -> column name, or a list for `features`), default text."""
    return dict(options.get("columns") or DEFAULT_COLUMNS)


def _columns(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not value:
        raise ValueError(
            f"dataset {name!r} option columns must map roles ({', '.join(COLUMN_ROLES)}) to column "
            f'names, e.g. {{"text": "body"}}, {{"text": "body", "label": "y"}} (sequence classification) '
            f'or {{"image": "img", "label": "y"}}; got {value!r}'
        )
    unknown = sorted(set(value) - set(COLUMN_ROLES))
    if unknown:
        raise ValueError(f"dataset {name!r} columns has unknown role(s) {', '.join(unknown)}; roles: {', '.join(COLUMN_ROLES)}")
    for role, column in value.items():
        if role == "features":
            if not isinstance(column, list) or not column or not all(isinstance(c, str) and c for c in column):
                raise ValueError(f"dataset {name!r} columns.features must be a list of column names; got {column!r}")
        elif not isinstance(column, str) or not column:
            raise ValueError(f"dataset {name!r} columns.{role} must be a column name; got {column!r}")
    inputs = [role for role in ("text", "image", "features") if role in value]
    if len(inputs) != 1:
        raise ValueError(
            f"dataset {name!r} columns must name exactly one input role of text, image, features; "
            f"got {', '.join(inputs) or 'none'}"
        )
    if inputs != ["text"] and "label" not in value:
        raise ValueError(f"dataset {name!r} columns with {inputs[0]} needs a label column")
    return dict(value)


def configured_dataset(name: str, options: Mapping[str, Any] | None = None) -> DatasetInfo:
    """The entry of dataset `name` with `options` applied; ValueError when refused.

    Own data: types and ranges checked, the task follows from the column mapping (`text`:
    language modelling, else classification); sizes stay None until the worker reads it."""
    info = require_dataset(name)
    if info.source == "builtin":
        return names.configured_dataset(name, options)
    options = dict(options or {})
    if info.source == "plugin":
        check_declared(f"dataset {name!r}", options, declared_options("dataset", name))
        return info
    if reason := check_options("dataset", name, options):
        raise ValueError(reason)
    if "val_fraction" in options:
        _fraction(name, "val_fraction", options["val_fraction"])
    if name == "imagefolder":
        size = _integer(name, "image_size", options.get("image_size", DEFAULT_IMAGE_SIZE), 1, MAX_IMAGE_SIZE)
        for key in ("random_resized_crop", "horizontal_flip"):
            if key in options:
                _flag(name, key, options[key])
        for key in ("mean", "std"):
            value = options.get(key)
            if value is not None and not (
                isinstance(value, list) and len(value) in (1, 3)
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
                and (key == "mean" or all(v > 0 for v in value))
            ):
                raise ValueError(f"dataset {name!r} option {key} must be a list of 1 or 3 numbers{' > 0' if key == 'std' else ''}; got {value!r}")
        return replace(info, image_size=size)
    if name == "files":
        if "data_files" not in options:
            raise ValueError(
                f'dataset {name!r} needs data_files: a file, a list, or {{"train": ..., "val": ...}} '
                "relative to data_root (parquet, jsonl or csv)"
            )
        _data_files(name, options["data_files"])
        if "format" in options and options["format"] not in FILE_FORMATS:
            raise ValueError(f"dataset {name!r} option format must be one of: {', '.join(FILE_FORMATS)}; got {options['format']!r}")
    columns = _columns(name, options["columns"]) if "columns" in options else DEFAULT_COLUMNS
    if "image_size" in options:
        _integer(name, "image_size", options["image_size"], 1, MAX_IMAGE_SIZE)
    max_len = _integer(name, "max_len", options.get("max_len", DEFAULT_MAX_LEN), 2, MAX_TEXT_LEN)
    if "packing" in options:
        _flag(name, "packing", options["packing"])
    tokenizer = options.get("tokenizer")
    if tokenizer is not None and tokenizer != "bytes":
        _relative_path(name, "tokenizer", tokenizer)
    if "text" in columns:
        if tokenizer is None:
            raise ValueError(
                f'dataset {name!r} with a text column needs tokenizer: "bytes" (byte level, no files) '
                "or a tokenizer directory relative to data_root"
            )
        if "label" not in columns:
            return replace(info, task="language_modeling", max_seq_len=max_len)
        if options.get("packing") is True:
            raise ValueError(
                f"dataset {name!r} with text and label columns is sequence classification: one row per "
                "document, so packing must be false or left out"
            )
        return replace(info, task="classification", max_seq_len=max_len)
    image = "image" in columns
    return replace(info, task="classification", max_seq_len=None,
                   channels=3 if image else None, image_size=None)


def check_compatible(model: str, dataset: str, dataset_options: Mapping[str, Any] | None = None) -> str | None:
    """None when `model` can train on `dataset` (with its options), else a reason that says
    what would work. Raises ValueError for names this node does not serve."""
    dataset_info = configured_dataset(dataset, dataset_options) if dataset_options else require_dataset(dataset)
    return mismatch(require_model(model), dataset_info)


def mismatch(model: ModelInfo, dataset: DatasetInfo) -> str | None:
    """None when `model` can train on `dataset` (as configured or as built), else a reason
    that says what would work."""
    if model.source in ("builtin", "torchvision") and dataset.source == "builtin":
        return names.check_compatible(model.name, dataset.name)
    if dataset.text_classification and model.source != "plugin" and model.task is not None:
        return (
            f"dataset {dataset.name!r} with text and label columns is sequence classification, which "
            f"model {model.name!r} cannot read (token ids): use an hf: model such as hf:bert or hf:gpt2 "
            "(built as AutoModelForSequenceClassification), a saved hf:<directory>, or a plugin"
        )
    if model.task is None or dataset.source == "plugin" or model.task == dataset.task:
        return None
    return (
        f"model {model.name!r} is for {model.task.replace('_', ' ')} but dataset {dataset.name!r} is a "
        f"{dataset.task.replace('_', ' ')} dataset here; datasets for {model.name!r}: "
        f"{', '.join(compatible_datasets(model.name))}"
    )


def compatible_datasets(model: str) -> list[str]:
    """Names of the datasets `model` can train on (own data by its default task), sorted."""
    task = require_model(model).task
    every = {**names.DATASETS, **OWN_DATASETS}
    return sorted(n for n, info in every.items() if task is None or info.task == task)


def compatible_models(dataset: str) -> list[str]:
    """Names of the catalog models that can train on `dataset`, built-ins first."""
    info = require_dataset(dataset)
    if info.source == "builtin":
        return names.compatible_models(dataset)
    return [name for name, entry in names.MODELS.items() if entry.task == info.task]


def models_listing() -> list[dict[str, Any]]:
    """JSON-ready `GET /v1/catalog/models` items: the catalog, the namespaces, the plugins."""
    namespaces = [
        {"name": f"{namespace}:", "description": description, "task": None, "source": namespace,
         "options": list(TIMM_OPTIONS if namespace == "timm" else HF_CONFIG_OPTIONS),
         "min_input_size": None, "compatible_datasets": compatible_datasets(f"{namespace}:x")}
        for namespace, description in MODEL_NAMESPACES.items()
    ]
    found = [
        {"name": name, "description": plugins.describe(ep), "task": None, "source": "plugin",
         "entry_point": ep.value, "options": list(require_model(name).options), "min_input_size": None,
         "compatible_datasets": compatible_datasets(name)}
        for name, ep in sorted(plugins.installed(plugins.MODEL_GROUP).items())
    ]
    catalog = [{**item, "compatible_datasets": compatible_datasets(item["name"])}
               for item in names.models_listing()]
    return [*catalog, *namespaces, *found]


def datasets_listing() -> list[dict[str, Any]]:
    """JSON-ready `GET /v1/catalog/datasets` items: the catalog, own data, the plugins."""
    own = [{**names.dataset_item(info, compatible_models(info.name)),
            **({"column_mappings": COLUMN_MAPPINGS} if "columns" in info.options else {})}
           for info in OWN_DATASETS.values()]
    found = [
        {**names.dataset_item(require_dataset(name), []), "entry_point": ep.value}
        for name, ep in sorted(plugins.installed(plugins.DATASET_GROUP).items())
    ]
    return [*names.datasets_listing(), *own, *found]
