"""Job specs shared by tests that train for real but must stay quick."""

from __future__ import annotations

from typing import Any

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
