"""Bad-input errors beyond body validation: one parameter (422), or a value the database refuses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError

from services.api.problems import Problem


def invalid_field(
    loc: tuple[str | int, ...], message: str, value: Any, allowed: Sequence[Any] | None = None
) -> RequestValidationError:
    """A 422 about one field: its path, what was wrong and, for closed sets, the allowed values."""
    error: dict[str, Any] = {"type": "value_error", "loc": loc, "msg": message, "input": value}
    if allowed is not None:
        error["type"] = "not_allowed"
        error["ctx"] = {"allowed": list(allowed)}
    return RequestValidationError([error])


async def _on_data_error(request: Request, exc: Exception) -> JSONResponse:
    # Only request values reach queries unchecked by type (a NUL byte inside an otherwise
    # valid string is the usual one, which PostgreSQL text cannot hold): the client's error.
    return Problem(
        400,
        "Bad Request",
        "a value in the request cannot be stored or searched for (e.g. it contains a NUL "
        "character or is out of range); remove it and retry",
    ).response()


def install_data_error_handler(app: FastAPI) -> None:
    app.add_exception_handler(DataError, _on_data_error)
