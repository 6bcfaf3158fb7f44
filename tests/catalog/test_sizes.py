"""The torch-free memory estimate (services.catalog.sizes) against torch itself: built-in
parameter counts exactly, activations within a factor, torchvision rows as measured."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from services.catalog import configured_dataset
from services.catalog.sizes import MemoryEstimate, estimate_memory, model_size

torch = pytest.importorskip("torch")

from services.catalog.build import build_model  # noqa: E402
from services.catalog.families.torchvision import TORCHVISION_MODELS  # noqa: E402
from services.catalog.measure import (  # noqa: E402
    activation_elements,
    parameter_count,
    sample_for,
    torchvision_row,
)
from services.catalog.model_sizes import TORCHVISION_SIZES  # noqa: E402

BUILTIN_CASES: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = [
    ("mlp", {}, "digits", {}),
    ("mlp", {"hidden": 7, "depth": 0}, "fake", {"image_size": 5, "num_classes": 3}),
    ("mlp", {"hidden": 9, "depth": 3}, "fake", {"image_size": 6}),
    ("small_cnn", {}, "digits", {}),
    ("small_cnn", {"width": 5}, "fake", {"image_size": 9, "num_classes": 7}),
    ("tiny_transformer", {}, "text", {"max_len": 16}),
    ("tiny_transformer", {"d_model": 12, "n_layers": 3, "n_heads": 3}, "text", {"max_len": 10}),
]


@pytest.mark.parametrize(("model", "options", "dataset", "data_options"), BUILTIN_CASES)
def test_builtin_parameters_are_exact_and_activations_a_close_floor(
    model: str, options: dict[str, Any], dataset: str, data_options: dict[str, Any]
) -> None:
    data = configured_dataset(dataset, data_options)
    params, acts = model_size(model, options, data)
    built = build_model(model, data, **options)
    assert params == parameter_count(built)
    measured = activation_elements(built, sample_for(data))
    # The transformer's attention weights live inside one fused call that no hook sees, so
    # the formula counts them on top of what the hooks measure; nothing is counted twice.
    assert measured <= acts <= 2 * measured


def test_torchvision_rows_are_what_torch_measures_and_cover_the_catalog() -> None:
    assert set(TORCHVISION_SIZES) == set(TORCHVISION_MODELS)
    for name in ("resnet18", "mobilenet_v3_small", "vit_b_32"):
        assert TORCHVISION_SIZES[name] == torchvision_row(name)


def test_torchvision_estimate_follows_classes_and_side() -> None:
    small = configured_dataset("fake", {"num_classes": 10, "image_size": 32})
    data = configured_dataset("fake", {"num_classes": 100, "image_size": 64})
    built = build_model("resnet18", data)
    params, acts = model_size("resnet18", {}, data)
    assert params == parameter_count(built)  # the head grows by (features + 1) per class
    assert acts == 4 * model_size("resnet18", {}, small)[1]  # 2x the side, 4x the pixels
    measured = activation_elements(built, sample_for(data))
    assert 0.9 * measured <= acts <= 1.1 * measured


def test_estimate_adds_weights_gradients_optimizer_state_and_activations() -> None:
    data = configured_dataset("digits")
    params, acts = model_size("mlp", {}, data)
    plain = estimate_memory("mlp", {}, data, micro_batch=8, precision="fp32", optimizer="sgd")
    assert plain == MemoryEstimate(params, acts, 8, params * 8, acts * 8 * 4)
    momentum = estimate_memory("mlp", {}, data, micro_batch=8, optimizer="sgd", momentum=0.9)
    adamw = estimate_memory("mlp", {}, data, micro_batch=8, precision="bf16", optimizer="adamw")
    assert momentum.weights_bytes == params * 12 and adamw.weights_bytes == params * 16
    assert adamw.activation_bytes == acts * 8 * 2
    assert adamw.total_bytes == params * 16 + acts * 16
    assert f"{params:,} parameters" in adamw.describe()


def test_the_estimate_imports_without_torch() -> None:
    code = (
        "import sys; from services.catalog.sizes import estimate_memory;"
        "from services.catalog import configured_dataset;"
        "estimate_memory('resnet50', {}, configured_dataset('fake'), micro_batch=2);"
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
