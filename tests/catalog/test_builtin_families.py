"""The torch-free catalog: it imports without torch, matches torchvision's registry, and its
compatibility rules, options and JSON listing say what the builders actually do."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from services.catalog import (
    DATASETS,
    MODELS,
    check_compatible,
    check_options,
    compatible_datasets,
    compatible_models,
    configured_dataset,
    configured_model,
    datasets_listing,
    models_listing,
    require_dataset,
    require_model,
)
from services.catalog.families.builtin_datasets import DATASET_OPTION_RANGE, DIGITS_TOTAL
from services.catalog.families.builtin_models import BUILTIN_MODELS, MODEL_OPTION_RANGE
from services.catalog.families.torchvision import TORCHVISION_MODELS


def test_importing_the_catalog_does_not_import_torch_or_numpy() -> None:
    code = (
        "import sys, services.catalog as c; c.models_listing(); c.datasets_listing(); c.check_compatible('mlp', 'text');"
        "heavy = [m for m in ('torch', 'torchvision', 'numpy', 'sklearn') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_torchvision_models_match_torchvision_registry() -> None:
    torchvision = pytest.importorskip("torchvision")
    registry = set(torchvision.models.list_models(module=torchvision.models))
    assert set(TORCHVISION_MODELS) == registry
    assert {n for n, info in MODELS.items() if info.source == "torchvision"} == registry
    assert set(MODELS) == registry | {"mlp", "small_cnn", "tiny_transformer"}


def test_every_entry_has_a_one_line_description() -> None:
    for info in [*MODELS.values(), *DATASETS.values()]:
        assert info.description.strip() and "\n" not in info.description, info.name
        assert len(info.description) <= 160, info.name


def test_shipped_digits_match_the_catalog_sizes() -> None:
    """The digits file ships with the package (no scikit-learn): 8x8 images of 0..16, ten labels."""
    from services.catalog.builders.datasets import load_digits_arrays

    images, labels = load_digits_arrays()
    assert images.shape == (DIGITS_TOTAL, 64) and labels.shape == (DIGITS_TOTAL,)
    assert images.min() == 0 and images.max() == 16 and (images == images.round()).all()
    assert sorted(set(labels.tolist())) == list(range(10))
    info = DATASETS["digits"]
    assert info.train_size + info.val_size == DIGITS_TOTAL


def test_compatible_exactly_when_tasks_match() -> None:
    for model in MODELS:
        for dataset in DATASETS:
            reason = check_compatible(model, dataset)
            same_task = MODELS[model].task == DATASETS[dataset].task
            assert (reason is None) == same_task, (model, dataset)
            assert (dataset in compatible_datasets(model)) == same_task, (model, dataset)
            assert (model in compatible_models(dataset)) == same_task, (model, dataset)


def test_incompatible_reason_names_what_would_work() -> None:
    reason = check_compatible("tiny_transformer", "digits")
    assert reason is not None
    assert "text" in reason and "small_cnn" in reason and "torchvision" in reason
    reason = check_compatible("resnet18", "text")
    assert reason is not None and "tiny_transformer" in reason


def test_the_demo_and_token_pairs_are_compatible() -> None:
    assert check_compatible("small_cnn", "digits") is None
    assert check_compatible("tiny_transformer", "text") is None
    assert compatible_datasets("tiny_transformer") == ["files", "hf_disk", "text"]  # + your own text
    assert compatible_models("text") == ["tiny_transformer"]


@pytest.mark.parametrize(
    ("call", "kind"),
    [
        (require_model, "model"),
        (require_dataset, "dataset"),
        (lambda n: check_compatible(n, "digits"), "model"),
    ],
)
def test_unknown_names_raise_value_error_listing_the_allowed_names(call, kind: str) -> None:
    with pytest.raises(ValueError, match=f"unknown {kind} 'resnet9000'") as excinfo:
        call("resnet9000")
    allowed = MODELS if kind == "model" else DATASETS
    assert all(name in str(excinfo.value) for name in allowed)


def test_check_options_lists_accepted_options() -> None:
    assert check_options("model", "mlp", {"hidden": 64, "depth": 2}) is None
    assert check_options("dataset", "fake", {"image_size": 16}) is None
    reason = check_options("model", "mlp", {"hiden": 64})
    assert reason is not None and "hiden" in reason and "hidden, depth" in reason
    reason = check_options("model", "resnet18", {"weights": "IMAGENET1K_V1"})
    assert reason is not None and "accepted options: none" in reason
    with pytest.raises(ValueError, match="kind must be"):
        check_options("optimizer", "sgd", {})


def test_configured_model_checks_option_names_and_ranges_without_torch() -> None:
    assert configured_model("mlp") == MODELS["mlp"]
    assert configured_model("mlp", {"hidden": 64, "depth": 0}) == MODELS["mlp"]  # a linear model
    for name, bad in (
        ("mlp", {"hidden": 0}),
        ("mlp", {"hidden": 2.5}),
        ("mlp", {"hidden": True}),
        ("mlp", {"depth": -1}),
        ("small_cnn", {"width": "8"}),
        ("mlp", {"hidden": 10**12}),
        ("mlp", {"depth": 10**6}),
        ("tiny_transformer", {"n_layers": 129}),
    ):
        key = next(iter(bad))
        low, high = MODEL_OPTION_RANGE[key]
        with pytest.raises(
            ValueError, match=rf"model '{name}' option {key} must be an integer from {low} to {high}"
        ):
            configured_model(name, bad)
    with pytest.raises(ValueError, match="accepted options: hidden, depth"):
        configured_model("mlp", {"width": 3})


def test_configured_dataset_applies_options_without_torch() -> None:
    assert configured_dataset("digits") == DATASETS["digits"]
    fake = configured_dataset("fake", {"size": 10, "image_size": 16, "num_classes": 4})
    assert (fake.train_size, fake.val_size, fake.image_size, fake.num_classes) == (
        10,
        DATASETS["fake"].val_size,
        16,
        4,
    )
    short = configured_dataset("text", {"max_len": 16})
    assert short.max_seq_len == 16 and short.train_size > DATASETS["text"].train_size
    for bad in (
        {"size": 0},
        {"size": "10"},
        {"size": True},
        {"num_classes": 1},
        {"size": 10**30},
        {"image_size": 10**6},
        {"val_size": 10**7},
    ):
        key = next(iter(bad))
        low, high = DATASET_OPTION_RANGE[key]
        with pytest.raises(ValueError, match=f"option {key} must be an integer from {low} to {high}"):
            configured_dataset("fake", bad)
    with pytest.raises(ValueError, match="option max_len must be an integer from 2 to 4096"):
        configured_dataset("text", {"max_len": 10**9})
    with pytest.raises(ValueError, match="accepted options: max_len"):
        configured_dataset("text", {"max_length": 16})


def test_listings_are_json_and_list_every_entry_with_compatibility() -> None:
    listing = json.loads(json.dumps({"models": models_listing(), "datasets": datasets_listing()}))
    models = {item["name"]: item for item in listing["models"]}
    datasets = {item["name"]: item for item in listing["datasets"]}
    # The catalog, then the namespaces and your own data (tests/catalog/test_namespace_own_plugin_families.py).
    assert set(MODELS) | {"timm:", "hf:"} <= set(models)
    assert set(DATASETS) | {"imagefolder", "files", "hf_disk"} <= set(datasets)
    assert models["tiny_transformer"]["compatible_datasets"] == ["files", "hf_disk", "text"]
    assert "small_cnn" in datasets["digits"]["compatible_models"]
    assert (
        datasets["mnist"]["needs_data_root"] is True
        and datasets["digits"]["needs_data_root"] is False
    )
    assert datasets["text"]["vocab_size"] == DATASETS["text"].vocab_size
    for name in MODELS:
        assert models[name]["description"] == MODELS[name].description
    assert list(models)[: len(BUILTIN_MODELS)] == list(BUILTIN_MODELS)
