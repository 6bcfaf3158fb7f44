"""Your own data: `imagefolder`, `files` (parquet, jsonl, csv) and `hf_disk` (a dataset saved
by Hugging Face `save_to_disk`), each under the job's data_root (torch-free).

The options are checked here, types and ranges, and the task follows from the column mapping
(`text`: language modelling, `text` and `label`: sequence classification, else
classification); sizes and classes stay None until the worker reads the data
(`own_data.build`, the `models` extra), which also checks what needs the data itself (a
column missing from a file).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from services.catalog.entries import Compatible, DatasetFamily, DatasetInfo, Task
from services.catalog.option_types import integer_in, undeclared

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
# What a column mapping can make of files and hf_disk (language modelling by default).
COLUMN_TASKS: tuple[Task, ...] = ("language_modeling", "classification")
FILE_FORMATS = ("parquet", "json", "csv")
DEFAULT_COLUMNS = {"text": "text"}
DEFAULT_IMAGE_SIZE = 224
DEFAULT_MAX_LEN = 128
MAX_TEXT_LEN = 65536
MAX_IMAGE_SIZE = 4096


def _own(name: str, description: str, task: Task, options: tuple[str, ...], **shape: Any) -> DatasetInfo:
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
        tasks=COLUMN_TASKS,
    ),
    "hf_disk": _own(
        "hf_disk",
        "A Hugging Face dataset saved with save_to_disk at data_root, with a column mapping "
        "(as files: text, text and label, image and label, features and label).",
        "language_modeling", HF_DISK_OPTIONS, max_seq_len=DEFAULT_MAX_LEN,
        tasks=COLUMN_TASKS,
    ),
}


def _fraction(name: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"dataset {name!r} option {key} must be a number between 0 and 1 (exclusive); got {value!r}")
    return float(value)


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


def configure(info: DatasetInfo, options: dict[str, Any]) -> DatasetInfo:
    """The entry with `options` applied; ValueError when refused. Types and ranges are
    checked, the task follows from the column mapping; sizes stay None."""
    name = info.name
    if reason := undeclared("dataset", name, options, info.options):
        raise ValueError(reason)
    if "val_fraction" in options:
        _fraction(name, "val_fraction", options["val_fraction"])
    if name == "imagefolder":
        size = integer_in("dataset", name, "image_size", options.get("image_size", DEFAULT_IMAGE_SIZE), 1, MAX_IMAGE_SIZE)
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
        integer_in("dataset", name, "image_size", options["image_size"], 1, MAX_IMAGE_SIZE)
    max_len = integer_in("dataset", name, "max_len", options.get("max_len", DEFAULT_MAX_LEN), 2, MAX_TEXT_LEN)
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


def listing(compatible: Compatible) -> list[dict[str, Any]]:
    return [info.listing_item(compatible(info.name),
                              **({"column_mappings": COLUMN_MAPPINGS} if "columns" in info.options else {}))
            for info in OWN_DATASETS.values()]


FAMILY = DatasetFamily(
    source="own", naming="catalog", names=OWN_DATASETS.keys, find=OWN_DATASETS.get,
    configure=configure, listing=listing, builder="services.catalog.builders.own_data:build",
)
