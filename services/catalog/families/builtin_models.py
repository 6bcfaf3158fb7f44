"""The built-in models: `mlp`, `small_cnn`, `tiny_transformer` (torch-free).

Their options are sizes and counts with inclusive ranges, checked at submit and again before
a build (`models.build_builtin`); their memory is counted by formula (`size`, checked against
torch exactly for parameters and within a factor for activations: tests/catalog/test_sizes.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.catalog.entries import Compatible, DatasetInfo, ModelFamily, ModelInfo
from services.catalog.option_types import integer_in, undeclared

BUILTIN_MODELS: dict[str, ModelInfo] = {
    "mlp": ModelInfo(
        name="mlp",
        description="Multilayer perceptron on flattened pixels (ReLU hidden layers); fast on CPU.",
        task="classification",
        source="builtin",
        options=("hidden", "depth"),
    ),
    "small_cnn": ModelInfo(
        name="small_cnn",
        description="Three 3x3 convolutions and a linear head, no BatchNorm or dropout; fast on CPU.",
        task="classification",
        source="builtin",
        options=("width",),
    ),
    "tiny_transformer": ModelInfo(
        name="tiny_transformer",
        description="Tiny causal Transformer language model (2 layers, d=64) for token tasks.",
        task="language_modeling",
        source="builtin",
        options=("d_model", "n_layers", "n_heads"),
    ),
}

# Every model option is a size or a count, inclusive (minimum, maximum); an MLP may have no
# hidden layer (a linear model). The maxima keep one option from asking for more than any
# device holds (mlp hidden 65536 x depth 64 is already 275 billion parameters: the memory
# estimate, services.catalog.sizes, refuses what is still too large).
MODEL_OPTION_RANGE: dict[str, tuple[int, int]] = {
    "hidden": (1, 65536),
    "depth": (0, 64),
    "width": (1, 4096),
    "d_model": (1, 8192),
    "n_layers": (1, 128),
    "n_heads": (1, 256),
}


def configure(info: ModelInfo, options: dict[str, Any]) -> ModelInfo:
    """The entry once `options` are declared and in range (ValueError naming both)."""
    if reason := undeclared("model", info.name, options, info.options):
        raise ValueError(reason)
    for key, value in options.items():
        integer_in("model", info.name, key, value, *MODEL_OPTION_RANGE[key])
    return info


def _mlp(options: Mapping[str, Any], data: DatasetInfo) -> tuple[int, int]:
    hidden, depth = options.get("hidden", 128), options.get("depth", 1)
    inputs, classes = _prod(data.input_shape), data.num_classes
    assert classes is not None  # a catalog dataset (sized_by_catalog)
    if depth == 0:
        params = inputs * classes + classes
    else:
        params = (inputs + 1) * hidden + (depth - 1) * (hidden + 1) * hidden
        params += (hidden + 1) * classes
    # Flatten, then a Linear and a ReLU output per hidden layer, then the logits.
    return params, inputs + 2 * depth * hidden + classes


def _small_cnn(options: Mapping[str, Any], data: DatasetInfo) -> tuple[int, int]:
    width, classes = options.get("width", 32), data.num_classes
    assert data.channels is not None and data.image_size is not None and classes is not None
    side, half = data.image_size, data.image_size // 2
    params = 9 * data.channels * width + width + 9 * width * width + width
    params += 9 * width * 2 * width + 2 * width + 8 * width * classes + classes
    # Two convolutions and their ReLUs at full side, the pool, a convolution and its ReLU at
    # half side (2w channels), the 2x2 pool and the logits.
    acts = 4 * width * side * side + 5 * width * half * half + 8 * width + classes
    return params, acts


def _tiny_transformer(options: Mapping[str, Any], data: DatasetInfo) -> tuple[int, int]:
    d, layers = options.get("d_model", 64), options.get("n_layers", 2)
    heads = options.get("n_heads", 4)
    assert data.vocab_size is not None and data.max_seq_len is not None
    vocab, length = data.vocab_size, data.max_seq_len
    # Embeddings; per block the attention in/out projections (4d^2 + 4d), the feed-forward
    # (8d^2 + 5d) and two LayerNorms (4d); the final LayerNorm and the head.
    params = (vocab + length) * d + layers * (12 * d * d + 13 * d) + 2 * d + (d + 1) * vocab
    # Per block 13 d-wide outputs per token (norms, dropouts, the 4d feed-forward twice)
    # and the heads' T x T attention weights; embeddings, final norm and logits.
    acts = 3 * length * d + layers * (13 * length * d + heads * length * length) + length * vocab
    return params, acts


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


_SIZES = {"mlp": _mlp, "small_cnn": _small_cnn, "tiny_transformer": _tiny_transformer}


def size(info: ModelInfo, options: Mapping[str, Any], data: DatasetInfo) -> tuple[int, int]:
    """(parameters, activation elements per sample) of the model sized for `data`."""
    return _SIZES[info.name](options, data)


def listing(compatible: Compatible) -> list[dict[str, Any]]:
    return [info.listing_item(compatible(info.name)) for info in BUILTIN_MODELS.values()]


FAMILY = ModelFamily(
    source="builtin", naming="catalog", names=BUILTIN_MODELS.keys, find=BUILTIN_MODELS.get,
    configure=configure, listing=listing, size=size,
    builder="services.catalog.builders.models:build_builtin",
)
