"""Installed plugins, a family of models and one of datasets: Python entry points in the
groups `accum.models` and `accum.datasets`.

    # a plugin package's pyproject.toml
    [project.entry-points."accum.models"]
    tiny_plugin_mlp = "accum_plugin_example.models:build"
    [project.entry-points."accum.model_options"]       # what the model accepts (torch-free)
    tiny_plugin_mlp = "accum_plugin_example.options:MLP_OPTIONS"

Listing reads the installed distributions' metadata only (`importlib.metadata`), so the API
process stays torch-free; the worker loads the function when it builds the job
(`own_models.build_plugin`, `datasets.build_plugin`). What a plugin function receives and returns is in docs/own-data.md
("Models", "Datasets").

A plugin declares the options it accepts in the groups `accum.model_options` and
`accum.dataset_options` (same name as its entry point): a plain mapping, `{"hidden": {"type":
"integer", "minimum": 1, "maximum": 4096}}`, in a module that imports no torch (the API loads it
to check a spec). Without a declaration a plugin accepts no options: free keys reached the
plugin's function unchecked, so one that opens a path could be made to read any file.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

from services.catalog.entries import Compatible, DatasetFamily, DatasetInfo, ModelFamily, ModelInfo
from services.catalog.option_types import (
    Option,
    check_declared,
    check_model_options,
    from_declaration,
)

MODEL_GROUP = "accum.models"
DATASET_GROUP = "accum.datasets"
OPTIONS_GROUPS = {MODEL_GROUP: "accum.model_options", DATASET_GROUP: "accum.dataset_options"}


def installed(group: str) -> dict[str, EntryPoint]:
    """Entry point name -> entry point, for one group, read fresh from the installed metadata
    (a package installed after start-up is seen by the next call)."""
    return {ep.name: ep for ep in entry_points(group=group)}


def describe(ep: EntryPoint) -> str:
    """One line: the function and the distribution that ships it."""
    dist = ep.dist
    shipped = f" from {dist.name} {dist.version}" if dist is not None else ""
    return f"plugin {ep.value}{shipped}"


def declared_options(group: str, name: str) -> dict[str, Option]:
    """The options plugin `name` of `group` declares (none without a declaration). Raises
    ValueError for a malformed declaration, naming its entry point."""
    entry = installed(OPTIONS_GROUPS[group]).get(name)
    if entry is None:
        return {}
    return from_declaration(f"plugin option declaration {entry.value}", entry.load())


def _model_entry(name: str, entry: EntryPoint) -> ModelInfo:
    return ModelInfo(name=name, description=describe(entry), task=None, source="plugin",
                     options=tuple(declared_options(MODEL_GROUP, name)))


def _dataset_entry(name: str, entry: EntryPoint) -> DatasetInfo:
    return DatasetInfo(name=name, description=describe(entry), task="classification", num_classes=None,
                       train_size=None, val_size=None, source="plugin",
                       options=tuple(declared_options(DATASET_GROUP, name)))


def find_model(name: str) -> ModelInfo | None:
    entry = installed(MODEL_GROUP).get(name)
    return None if entry is None else _model_entry(name, entry)


def find_dataset(name: str) -> DatasetInfo | None:
    entry = installed(DATASET_GROUP).get(name)
    return None if entry is None else _dataset_entry(name, entry)


def configure_model(info: ModelInfo, options: dict[str, Any]) -> ModelInfo:
    check_model_options(info.name, options, declared_options(MODEL_GROUP, info.name))
    return info


def configure_dataset(info: DatasetInfo, options: dict[str, Any]) -> DatasetInfo:
    check_declared(f"dataset {info.name!r}", options, declared_options(DATASET_GROUP, info.name))
    return info


def list_models(compatible: Compatible) -> list[dict[str, Any]]:
    return [_model_entry(name, ep).listing_item(compatible(name), entry_point=ep.value)
            for name, ep in sorted(installed(MODEL_GROUP).items())]


def list_datasets(compatible: Compatible) -> list[dict[str, Any]]:
    """Plugin datasets list no compatible models: their task is known once built."""
    return [_dataset_entry(name, ep).listing_item([], entry_point=ep.value)
            for name, ep in sorted(installed(DATASET_GROUP).items())]


def _model_names() -> list[str]:
    return list(installed(MODEL_GROUP))


def _dataset_names() -> list[str]:
    return list(installed(DATASET_GROUP))


MODEL_FAMILY = ModelFamily(
    source="plugin", naming="plugin", names=_model_names, find=find_model,
    configure=configure_model, listing=list_models, builder="services.catalog.builders.own_models:build_plugin",
)
DATASET_FAMILY = DatasetFamily(
    source="plugin", naming="plugin", names=_dataset_names, find=find_dataset,
    configure=configure_dataset, listing=list_datasets, builder="services.catalog.builders.datasets:build_plugin",
)
