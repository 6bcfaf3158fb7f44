"""What the catalog knows of one model or dataset name, and the shape of a family of them
(torch-free).

A family is one way of naming models or datasets (the built-in ones, torchvision's, `timm:`,
`hf:`, your own data, plugins): how its names look, which options each takes, the listing
items it serves, the memory formula when it has one, and the torch function that builds it.
`services.catalog.families` defines them and holds them in order (the registry);
`services.catalog.resolve` answers from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

Task = Literal["classification", "language_modeling"]
Source = Literal["builtin", "torchvision", "timm", "hf", "plugin"]
DatasetSource = Literal["builtin", "own", "plugin"]
# catalog: fixed names, listed by name; namespace: `prefix:<rest>` patterns; plugin: installed
# entry points, read from the metadata at each call.
Naming = Literal["catalog", "namespace", "plugin"]


@dataclass(frozen=True)
class ModelInfo:
    """One model the service can build by name.

    `min_input_size` and `input_multiple` describe what the image side is resized to for
    torchvision models: side = round_up(max(dataset side, min_input_size), input_multiple).
    `options` are the keyword options a spec may pass (`{"name": "mlp", "hidden": 256}`), the
    only ones (`timm:`, `hf:` and plugin families type them: their `options` schema).
    `task` None: the task follows from the dataset (`hf:` models, plugins).
    """

    name: str
    description: str
    task: Task | None
    source: Source
    min_input_size: int | None = None
    input_multiple: int = 1
    options: tuple[str, ...] = ()

    def listing_item(self, compatible: list[str], **extra: Any) -> dict[str, Any]:
        """One JSON-ready `GET /v1/catalog/models` item."""
        return {"name": self.name, "description": self.description, "task": self.task,
                "source": self.source, **extra, "options": list(self.options),
                "min_input_size": self.min_input_size, "compatible_datasets": compatible}


@dataclass(frozen=True)
class DatasetInfo:
    """One dataset the service can build by name (sizes are those of the default options).

    Your own data (`imagefolder`, `files`, `hf_disk`, plugins) has no size or class count
    before the worker reads it: those are None here and known in the built bundle's info.
    """

    name: str
    description: str
    task: Task
    num_classes: int | None
    train_size: int | None
    val_size: int | None
    channels: int | None = None
    image_size: int | None = None
    vocab_size: int | None = None
    max_seq_len: int | None = None
    needs_data_root: bool = False
    options: tuple[str, ...] = ()
    source: DatasetSource = "builtin"
    features: int | None = None  # tabular rows: the number of feature columns
    pad_token_id: int | None = None  # text classification: the id its batches are padded with
    # The tasks its options can give (own data: the column mapping decides); () = `task` only.
    tasks: tuple[Task, ...] = ()

    @property
    def possible_tasks(self) -> tuple[Task, ...]:
        """Every task this dataset can train with some options: what compatibility lists."""
        return self.tasks or (self.task,)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input sample: (C, H, W) for images, (max_seq_len,) for token sequences."""
        if self.channels is not None and self.image_size is not None:
            return (self.channels, self.image_size, self.image_size)
        if self.features is not None:
            return (self.features,)
        assert self.max_seq_len is not None
        return (self.max_seq_len,)

    @property
    def text_classification(self) -> bool:
        """Token sequences with one class label each (own data with text and label columns)."""
        return self.task == "classification" and self.max_seq_len is not None

    def listing_item(self, compatible: list[str], **extra: Any) -> dict[str, Any]:
        """One JSON-ready `GET /v1/catalog/datasets` item."""
        return {
            "name": self.name, "description": self.description, "task": self.task,
            "source": self.source, "num_classes": self.num_classes, "train_size": self.train_size,
            "val_size": self.val_size, "channels": self.channels, "image_size": self.image_size,
            "vocab_size": self.vocab_size, "max_seq_len": self.max_seq_len,
            "needs_data_root": self.needs_data_root, "options": list(self.options),
            "compatible_models": compatible, **extra,
        }


class NameRefused(ValueError):
    """A name in a family's namespace that the family cannot take; the message says why
    (`resolve` adds what is served)."""


InfoT = TypeVar("InfoT", "ModelInfo", "DatasetInfo")
# a model name -> the datasets it trains on, or a dataset name -> the catalog models for it
Compatible = Callable[[str], list[str]]


@dataclass(frozen=True)
class Family(Generic[InfoT]):
    """One family of models or datasets (see the module docstring).

    `names()` are its fixed or installed names (none for a namespace); `find(name)` is the
    entry of a name of this family, None when the name is not its own (NameRefused when
    malformed); `configure(info, options)` checks the options, its schema (ValueError, or
    OptionError naming the key), and returns the entry with them applied; `listing` gives its
    catalog items; `builder` is `"module:function"`, the torch function that
    `services.catalog.build` imports only when the worker builds such a name: `(info,
    dataset_info, options) -> nn.Module` for a model, `(info, *, data_root, download, seed,
    options) -> DatasetBundle` for a dataset.
    """

    source: str
    naming: Naming
    names: Callable[[], Iterable[str]]
    find: Callable[[str], InfoT | None]
    configure: Callable[[InfoT, dict[str, Any]], InfoT]
    listing: Callable[[Compatible], list[dict[str, Any]]]
    builder: str


@dataclass(frozen=True)
class ModelFamily(Family[ModelInfo]):
    """A family of models: a namespace family takes the names `<namespace>:<rest>` (served as
    `patterns`); `size(info, options, dataset)` gives (parameters, activation elements per
    sample) where a formula exists (`services.catalog.sizes`)."""

    namespace: str | None = None
    patterns: tuple[str, ...] = ()
    size: Callable[[ModelInfo, Mapping[str, Any], DatasetInfo], tuple[int, int]] | None = None


DatasetFamily = Family[DatasetInfo]


def namespace_family(
    namespace: Source,
    *,
    description: str,
    options: Iterable[str],
    patterns: tuple[str, ...],
    find: Callable[[str], ModelInfo | None],
    configure: Callable[[ModelInfo, dict[str, Any]], ModelInfo],
    builder: str,
) -> ModelFamily:
    """A `namespace:<rest>` family, listed as one item `<namespace>:` with its options."""
    entry = ModelInfo(name=f"{namespace}:", description=description, task=None, source=namespace,
                      options=tuple(options))

    def listing(compatible: Compatible) -> list[dict[str, Any]]:
        return [entry.listing_item(compatible(f"{namespace}:x"))]

    return ModelFamily(source=namespace, naming="namespace", namespace=namespace, patterns=patterns,
                       names=tuple, find=find, configure=configure, listing=listing, builder=builder)
