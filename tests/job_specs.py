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


def only_spec_error(raw: dict[str, Any]) -> dict[str, Any]:
    """The one validation error ``parse_spec(raw)`` raises (its loc, msg, ctx)."""
    import pytest
    from pydantic import ValidationError

    from services.spec import parse_spec

    with pytest.raises(ValidationError) as caught:
        parse_spec(raw)
    errors = caught.value.errors(include_url=False)
    assert len(errors) == 1, errors
    return dict(errors[0])
