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

Each model family that can be sized gives (parameters, activation elements per sample) as
its `size`: the built-in models by formula (`families/builtin_models.py`), torchvision's from a
measured table (`families/torchvision.py`, `model_sizes.py`); tests/catalog/test_sizes.py
checks both against torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.catalog.entries import DatasetInfo
from services.catalog.families import model_family
from services.catalog.resolve import require_model

FP32_BYTES = 4
# Bytes per parameter besides its fp32 weight and gradient: AdamW keeps two moments, SGD a
# momentum buffer only when momentum is on.
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adamw8bit": 2, "sgd_momentum": 4, "sgd": 0}  # 8-bit: two 1-byte moments
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    """The floor of one device's memory for a training step, in bytes, with its parts."""

    parameters: int
    activation_elements_per_sample: int
    micro_batch: int
    weights_bytes: int  # weights + gradients + optimizer state (this device's share)
    activation_bytes: int
    shards: int = 1  # FSDP: the devices the weights are sharded over; 0: in host memory

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes

    def describe(self) -> str:
        share = "" if self.shards == 1 else (
            " in host memory (fsdp.cpu_offload)" if self.shards == 0 else f" per device (sharded over {self.shards})"
        )
        return (
            f"{self.parameters:,} parameters take {gib(self.weights_bytes)}{share} with their gradients "
            f"and optimizer state, and {self.micro_batch} sample(s) per micro-batch keep "
            f"{gib(self.activation_bytes)} of activations: at least {gib(self.total_bytes)}"
        )


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def model_size(name: str, options: Mapping[str, Any], data: DatasetInfo) -> tuple[int, int]:
    """(parameters, activation elements per sample) of model `name` sized for `data`."""
    info = require_model(name)
    size = model_family(info).size
    if size is None:
        raise ValueError(f"model {name!r} ({info.source}) has no size without torch: it is known once built")
    return size(info, options, data)


def estimate_memory(
    model: str,
    options: Mapping[str, Any],
    data: DatasetInfo,
    *,
    micro_batch: int,
    precision: str = "fp32",
    optimizer: str = "sgd",
    momentum: float = 0.0,
    shards: int = 1,
) -> MemoryEstimate:
    """The floor of one device's memory for a step of `micro_batch` samples (see the module);
    `shards`: FSDP's share of the weights per device (1/shards; 0: offloaded to the host)."""
    params, acts = model_size(model, options, data)
    state = "sgd_momentum" if optimizer == "sgd" and momentum else optimizer
    return MemoryEstimate(
        parameters=params,
        activation_elements_per_sample=acts,
        micro_batch=micro_batch,
        weights_bytes=params * (2 * FP32_BYTES + OPTIMIZER_STATE_BYTES[state]) // shards if shards else 0,
        activation_bytes=acts * micro_batch * ACTIVATION_BYTES[precision],
        shards=shards,
    )
