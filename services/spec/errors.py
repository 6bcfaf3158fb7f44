"""Spec validation errors that carry their fix, and closed-set validators.

Messages are written in full here (f-strings) rather than as pydantic templates; the error
context carries only `allowed`, the list of valid values where there is a closed set, which
`services.api.errors` copies into the response's `errors[].allowed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError


def spec_error(
    kind: str, message: str, allowed: Sequence[Any] | None = None
) -> PydanticCustomError:
    """A validation error of type `kind`; `allowed` lists the valid values when there is a set."""
    return PydanticCustomError(
        kind, message, {"allowed": list(allowed)} if allowed is not None else None
    )


def not_allowed(what: str, value: Any, allowed: Sequence[str]) -> PydanticCustomError:
    """The error for a value outside a closed set: says what was given and lists the choices."""
    return spec_error(
        "not_allowed", f"unknown {what} {value!r}; choose one of: {', '.join(allowed)}", allowed
    )


def one_of(what: str, allowed: Sequence[str]) -> WrapValidator:
    """Annotate a `str`/`Literal` field so a bad value fails with the list of allowed ones.

    The wrapped type still drives the JSON schema (an enum for a Literal).
    """

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, str) and value in allowed:
            return value
        raise not_allowed(what, value, allowed)

    return WrapValidator(validate)
