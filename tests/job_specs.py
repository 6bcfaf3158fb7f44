"""Job specs shared by the tests: one place for the smallest valid spec and the quick real one."""

from __future__ import annotations

from typing import Any

# The smallest valid spec: what tests of the API, the store and the spec change field by field.
# Copy it before changing a nested value (`{**MINIMAL_SPEC, "optimizer": {...}}`).
MINIMAL_SPEC: dict[str, Any] = {
    "model": "mlp",
    "dataset": "digits",
    "micro_batch_size": 16,
    "accumulation_steps": 4,
    "epochs": 1,
    "optimizer": {"name": "sgd", "lr": 0.1},
}

# Three optimizer steps of the mlp on digits, on the CPU: a second or two.
TINY_SPEC: dict[str, Any] = {
    "model": "mlp",
    "dataset": "digits",
    "micro_batch_size": 16,
    "accumulation_steps": 2,
    "max_steps": 3,
    "optimizer": {"name": "sgd", "lr": 0.1},
    "gpus": 0,
}
