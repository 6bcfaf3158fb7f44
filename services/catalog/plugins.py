"""Installed plugins: Python entry points in the groups `accum.models` and `accum.datasets`.

    # a plugin package's pyproject.toml
    [project.entry-points."accum.models"]
    tiny_plugin_mlp = "accum_plugin_example.models:build"
    [project.entry-points."accum.model_options"]       # what the model accepts (torch-free)
    tiny_plugin_mlp = "accum_plugin_example.options:MLP_OPTIONS"

Listing reads the installed distributions' metadata only (`importlib.metadata`), so the API
process stays torch-free; the worker loads the function when it builds the job
(`services.catalog.build`). What a plugin function receives and returns is in docs/own-data.md
("Models", "Datasets").

A plugin declares the options it accepts in the groups `accum.model_options` and
`accum.dataset_options` (same name as its entry point): a plain mapping, `{"hidden": {"type":
"integer", "minimum": 1, "maximum": 4096}}`, in a module that imports no torch (the API loads it
to check a spec). Without a declaration a plugin accepts no options: free keys reached the
plugin's function unchecked, so one that opens a path could be made to read any file.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from services.catalog.option_types import Option, from_declaration

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
