"""422s for a misspelt field: pydantic says only "Extra inputs are not permitted"; a person
wants the name they meant. The names come from the route's own body model, walked along the
error's path, so every route with a body gets this."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Request
from pydantic import BaseModel


def body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model of the route's body (None for a route without one)."""
    route = request.scope.get("route")
    info = getattr(getattr(route, "body_field", None), "field_info", None)
    return _model_in(getattr(info, "annotation", None))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model inside `Model`, `Model | None`, `Annotated[Model, ...]`, `str | Model`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (model := _model_in(arg)) is not None:
            return model
    return None


def field_names_at(model: type[BaseModel], path: Sequence[Any]) -> list[str] | None:
    """The field names of the mapping at `path` under `model` (None where no model is)."""
    current: type[BaseModel] | None = model
    for part in path:
        field = current.model_fields.get(str(part)) if current else None
        current = _model_in(field.annotation) if field else None
    return list(current.model_fields) if current else None


def _nested_names(model: type[BaseModel], path: Sequence[Any]) -> list[str]:
    """`optimizer.lr`, ...: the fields one mapping below the one at `path`, dotted, for a
    field written a level too high (`lr: 0.1` beside `model`)."""
    names = field_names_at(model, path) or []
    return [f"{name}.{inner}" for name in names
            for inner in field_names_at(model, [*path, name]) or []]


def _meant(given: str, names: list[str], model: type[BaseModel], path: Sequence[Any]) -> str | None:
    close = difflib.get_close_matches(given, names, n=1, cutoff=0.6)
    if close:
        return close[0]
    nested = _nested_names(model, path)
    lasts = {name.rsplit(".", 1)[-1]: name for name in nested}
    deeper = difflib.get_close_matches(given, list(lasts), n=1, cutoff=0.8)
    return lasts[deeper[0]] if deeper else None


def explain_unknown_fields(
    errors: Sequence[Mapping[str, Any]], model: type[BaseModel] | None
) -> list[Mapping[str, Any]]:
    """`errors` with each unknown field's message naming the closest field and, in
    `ctx.allowed`, every field of its mapping. A misspelt field is said once: the error that
    the field it stands for is missing (`max_step` for `max_steps`) is dropped."""
    explained: list[Mapping[str, Any]] = []
    meant: set[tuple[Any, ...]] = set()
    for error in errors:
        loc = tuple(error.get("loc", ()))
        names = field_names_at(model, loc[1:-1]) if model and error.get("type") == "extra_forbidden" and loc else None
        if not names or model is None:
            explained.append(error)
            continue
        given = str(loc[-1])
        close = _meant(given, names, model, loc[1:-1])
        hint = f"did you mean {close}?" if close else f"one of: {', '.join(names)}"
        if close:
            meant.add((*loc[:-1], close))
        explained.append({**error, "msg": f"unknown field {given!r}; {hint}",
                          "ctx": {"allowed": names}})
    return [error for error in explained if not _stands_for_typo(error, meant)]


def _stands_for_typo(error: Mapping[str, Any], meant: set[tuple[Any, ...]]) -> bool:
    """A missing-field error about a field that a misspelt one was meant to be."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "missing":
        return loc in meant
    if error.get("type") == "missing_one_of":
        allowed = (error.get("ctx") or {}).get("allowed") or []
        return any((*loc[:-1], name) in meant for name in allowed)
    return False
