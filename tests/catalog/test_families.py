"""The registry of families: each name is found by exactly one family, each family names a
builder the worker can import, and what the catalog serves is derived from the families."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import services.catalog
from services.catalog import (
    DATASETS,
    MODELS,
    OWN_DATASETS,
    require_dataset,
    require_model,
    served_names,
)
from services.catalog.families import DATASET_FAMILIES, MODEL_FAMILIES, dataset_family, model_family

# The torch part of the catalog: what builds the objects, and the tool that measures them.
TORCH_PART = ("services.catalog.build", "services.catalog.measure", "services.catalog.builders")


def catalog_modules() -> list[str]:
    package = Path(services.catalog.__file__).parent
    names = (".".join(("services", *p.relative_to(package.parent).with_suffix("").parts)) for p in package.rglob("*.py"))
    return sorted(name.removesuffix(".__init__") for name in names)


def test_only_the_builders_import_torch() -> None:
    torch_free = [m for m in catalog_modules() if not m.startswith(TORCH_PART)]
    assert {"services.catalog", "services.catalog.families", "services.catalog.families.hf"} <= set(torch_free)
    assert "services.catalog.builders.models" in catalog_modules()
    code = (
        "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]];"
        "heavy = [m for m in ('torch', 'torchvision', 'numpy', 'timm', 'transformers') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code, *torch_free], check=True, timeout=120)


@pytest.mark.parametrize("families", [MODEL_FAMILIES, DATASET_FAMILIES], ids=["models", "datasets"])
def test_each_family_has_its_own_source_and_an_importable_builder(families: tuple) -> None:
    sources = [family.source for family in families]
    assert len(set(sources)) == len(sources), sources
    for family in families:
        module, _, function = family.builder.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), family.builder


def test_every_catalog_name_is_found_by_one_family_only() -> None:
    for name, info in MODELS.items():
        found = [f.source for f in MODEL_FAMILIES if f.naming == "catalog" and f.find(name) is not None]
        assert found == [info.source], (name, found)
        assert model_family(require_model(name)).source == info.source
    for name, data in {**DATASETS, **OWN_DATASETS}.items():
        found = [f.source for f in DATASET_FAMILIES if f.naming == "catalog" and f.find(name) is not None]
        assert found == [data.source], (name, found)
        assert dataset_family(require_dataset(name)).source == data.source


def test_served_names_are_the_families_names_then_patterns_then_plugins() -> None:
    models = served_names("model")
    catalog = sorted(n for f in MODEL_FAMILIES if f.naming == "catalog" for n in f.names())
    assert models[: len(catalog)] == catalog == sorted(MODELS)
    patterns = [p for f in MODEL_FAMILIES for p in f.patterns]
    assert models[len(catalog) : len(catalog) + len(patterns)] == patterns
    assert patterns == ["timm:<name>", "hf:<model_type>", "hf:<directory>"]
    datasets = served_names("dataset")
    assert datasets[: len(DATASETS) + len(OWN_DATASETS)] == sorted([*DATASETS, *OWN_DATASETS])


def test_a_namespace_name_goes_to_its_family_only() -> None:
    assert require_model("timm:resnet18").source == "timm"
    assert require_model("hf:/models/saved").source == "hf"
    with pytest.raises(ValueError, match="namespace 'tv' is not one of: timm, hf"):
        require_model("tv:resnet18")
    with pytest.raises(ValueError, match="a timm name is letters"):
        require_model("timm:bad name")
