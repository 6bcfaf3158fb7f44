"""How much memory one training step of a catalog model needs, estimated without torch.

    from services.catalog.sizes import estimate_memory
    est = estimate_memory("mlp", {"hidden": 4096}, configured_dataset("fake"), micro_batch=64,
                          precision="fp32", optimizer="adamw", momentum=0.0)
    est.total_bytes, est.parameters, est.activation_bytes

The API refuses a spec whose estimate is above the largest device it may run on, so a job
that cannot fit never takes a worker down. The estimate is meant as a floor, not a forecast:
weights, gradients and optimizer state in fp32, plus every layer's output for `micro_batch`
samples (what backward keeps), and nothing for the allocator, workspaces or the CUDA context.
A spec refused by it cannot fit; one it accepts may still run out of memory, which the
trainer's out-of-memory back-off and the worker handle.

Built-in models are counted by formula (tests/catalog/test_sizes.py checks the parameter
counts against torch exactly and the activations within a factor); torchvision models come
from `model_sizes.py`, measured with torch by `python -m services.catalog.measure --write`
at REFERENCE_CLASSES classes on a 32x32 image, and scaled with the class count and the side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.catalog.model_sizes import TORCHVISION_SIZES
from services.catalog.names import DatasetInfo, ModelInfo, require_model, torchvision_input_side

REFERENCE_CLASSES = 10
REFERENCE_IMAGE_SIZE = 32
FP32_BYTES = 4
# Bytes per parameter besides its fp32 weight and gradient: AdamW keeps two moments, SGD a
# momentum buffer only when momentum is on.
OPTIMIZER_STATE_BYTES = {"adamw": 8, "sgd_momentum": 4, "sgd": 0}
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    """The floor of one device's memory for a training step, in bytes, with its parts."""

    parameters: int
    activation_elements_per_sample: int
    micro_batch: int
    weights_bytes: int  # weights + gradients + optimizer state
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes

    def describe(self) -> str:
        return (
            f"{self.parameters:,} parameters take {gib(self.weights_bytes)} with their gradients "
            f"and optimizer state, and {self.micro_batch} sample(s) per micro-batch keep "
            f"{gib(self.activation_bytes)} of activations: at least {gib(self.total_bytes)}"
        )


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


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
    assert data.channels is not None and data.image_size is not None
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


def _torchvision(info: ModelInfo, data: DatasetInfo) -> tuple[int, int]:
    params, per_class, acts = TORCHVISION_SIZES[info.name]
    assert data.num_classes is not None and data.image_size is not None  # sized_by_catalog
    params += (data.num_classes - REFERENCE_CLASSES) * per_class
    reference = torchvision_input_side(info, REFERENCE_IMAGE_SIZE)
    side = torchvision_input_side(info, data.image_size)
    # Convolutions scale with the pixels (attention faster still: a floor either way).
    return params, acts * side * side // (reference * reference)


_BUILTIN = {"mlp": _mlp, "small_cnn": _small_cnn, "tiny_transformer": _tiny_transformer}


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def model_size(name: str, options: Mapping[str, Any], data: DatasetInfo) -> tuple[int, int]:
    """(parameters, activation elements per sample) of model `name` sized for `data`."""
    info = require_model(name)
    if info.source == "torchvision":
        return _torchvision(info, data)
    return _BUILTIN[name](options, data)


def estimate_memory(
    model: str,
    options: Mapping[str, Any],
    data: DatasetInfo,
    *,
    micro_batch: int,
    precision: str = "fp32",
    optimizer: str = "sgd",
    momentum: float = 0.0,
) -> MemoryEstimate:
    """The floor of one device's memory for a step of `micro_batch` samples (see the module)."""
    params, acts = model_size(model, options, data)
    state = "sgd_momentum" if optimizer == "sgd" and momentum else optimizer
    return MemoryEstimate(
        parameters=params,
        activation_elements_per_sample=acts,
        micro_batch=micro_batch,
        weights_bytes=params * (2 * FP32_BYTES + OPTIMIZER_STATE_BYTES[state]),
        activation_bytes=acts * micro_batch * ACTIVATION_BYTES[precision],
    )
