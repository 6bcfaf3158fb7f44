"""Why a job spec is refused at one field: the one shape every admission check answers in.

    Refusal(("dataset", "data_root"), "data_root '/etc' is outside ...", "/etc")
    refusal.as_error()   # {"type", "loc": ("body", "dataset", "data_root"), "msg", "input", "ctx"?}

The API answers a check's refusals as one 422 (each at `body.<field>`, with `allowed` where the
values form a closed set); the worker fails a stored job with their messages
(services/admission). Torch-free, imports nothing of the service.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Refusal:
    """The field's path inside the spec, the reason (with the fix), the value given, the values
    that would do (a closed set only) and the 422 item's `type` when it is neither
    `value_error` nor `not_allowed` (the service limits say `limit`)."""

    field: tuple[str | int, ...]
    message: str
    value: Any
    allowed: Sequence[Any] | None = None
    kind: str | None = None

    def as_error(self) -> dict[str, Any]:
        """The refusal as a pydantic error dict at `body.<field>`, as FastAPI's own 422s are
        (the API's error handler renders both the same way)."""
        kind = self.kind or ("value_error" if self.allowed is None else "not_allowed")
        error: dict[str, Any] = {"type": kind, "loc": ("body", *self.field), "msg": self.message,
                                 "input": self.value}
        if self.allowed is not None:
            error["ctx"] = {"allowed": list(self.allowed)}
        return error
