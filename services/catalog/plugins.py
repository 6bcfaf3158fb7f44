"""Installed plugins: Python entry points in the groups `accum.models` and `accum.datasets`.

    # a plugin package's pyproject.toml
    [project.entry-points."accum.models"]
    tiny_plugin_mlp = "accum_plugin_example.models:build"

Listing reads the installed distributions' metadata only (`importlib.metadata`), so the API
process stays torch-free; the worker loads the function when it builds the job
(`services.catalog.build`). What a plugin function receives and returns is in docs/own-data.md
("Models", "Datasets").
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

MODEL_GROUP = "accum.models"
DATASET_GROUP = "accum.datasets"


def installed(group: str) -> dict[str, EntryPoint]:
    """Entry point name -> entry point, for one group, read fresh from the installed metadata
    (a package installed after start-up is seen by the next call)."""
    return {ep.name: ep for ep in entry_points(group=group)}


def describe(ep: EntryPoint) -> str:
    """One line: the function and the distribution that ships it."""
    dist = ep.dist
    shipped = f" from {dist.name} {dist.version}" if dist is not None else ""
    return f"plugin {ep.value}{shipped}"
