"""422 messages in our words: pydantic's own ("Input should be a valid integer", "Field
required") say neither the bounds nor what to give. Each is rewritten from the route's body
model, read as JSON Schema along the error's path, so the message names what the field takes
(`must be an integer from 1 to 100000000; got 3.5`). Our own validators' messages are kept."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from pydantic import BaseModel

Schema = Mapping[str, Any]

# pydantic's error types whose text is pydantic's, rewritten here (every other type is ours).
_TYPE_ERRORS = frozenset({
    "int_type", "int_parsing", "int_from_float", "float_type", "float_parsing", "bool_type",
    "bool_parsing", "string_type", "dict_type", "model_type", "model_attributes_type",
    "list_type", "tuple_type", "literal_error", "enum", "none_required",
})
_BOUND_ERRORS = frozenset({
    "greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short",
    "too_long", "string_too_short", "string_too_long", "finite_number",
})
SHOWN_INPUT = 40  # characters of a refused value quoted back


@cache
def _schema(model: type[BaseModel]) -> Schema | None:
    try:
        return model.model_json_schema()
    except Exception:  # noqa: BLE001 - a model without a JSON schema keeps pydantic's words
        return None


def _expand(node: Schema, defs: Schema) -> list[Schema]:
    """The non-null alternatives of a schema node, `$ref`s followed."""
    if "$ref" in node:
        node = defs.get(str(node["$ref"]).rsplit("/", 1)[-1], {})
    for key in ("anyOf", "oneOf"):
        if key in node:
            return [leaf for branch in node[key] for leaf in _expand(branch, defs)]
    return [] if node.get("type") == "null" else [node]


def _child(node: Schema, part: Any) -> Schema | None:
    if isinstance(part, int) and node.get("type") == "array":
        prefix = node.get("prefixItems") or []
        return prefix[part] if part < len(prefix) else node.get("items")
    properties = node.get("properties") or {}
    if isinstance(part, str) and part in properties:
        return properties[part]
    extra = node.get("additionalProperties")
    return extra if node.get("type") == "object" and isinstance(extra, dict) else None


def nodes_at(model: type[BaseModel] | None, path: Sequence[Any]) -> list[Schema]:
    """The schema alternatives of the field at `path` under `model` ([] where unknown).
    A part no alternative has (pydantic's union tags, such as `int` or `function-wrap[...]`)
    is passed over."""
    schema = _schema(model) if model else None
    if schema is None:
        return []
    defs = schema.get("$defs") or {}
    nodes = _expand(schema, defs)
    for part in path:
        found = [leaf for node in nodes if (child := _child(node, part)) is not None
                 for leaf in _expand(child, defs)]
        nodes = found or nodes
    return nodes


def _number(value: Any) -> str:
    """`0.5`, `10`, `100,000,000`: as written in docs, large integers grouped."""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:g}"
    return f"{int(value):,}"


def _range(node: Schema, integer: bool) -> str:
    low, high = node.get("minimum"), node.get("maximum")
    above, below = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if integer:  # an integer's exclusive bound is the next integer's inclusive one
        low = above + 1 if above is not None and low is None else low
        high = below - 1 if below is not None and high is None else high
        above = below = None
    parts = []
    if low is not None and high is not None:
        return f" from {_number(low)} to {_number(high)}"
    if low is not None:
        parts.append(f"at least {_number(low)}")
    if above is not None:
        parts.append(f"greater than {_number(above)}")
    if high is not None:
        parts.append(f"at most {_number(high)}")
    if below is not None:
        parts.append(f"less than {_number(below)}")
    return " " + " and ".join(parts) if parts else ""


def _count(low: int | None, high: int | None, unit: str) -> str:
    """` of 2 items`, ` of 1 to 40 characters`, ` of at most 20 items` ('' without bounds)."""
    low = low or None  # at least 0 says nothing
    if low is None and high is None:
        return ""
    many = f"{unit}s" if (high if high is not None else low) != 1 else unit
    if low == high:
        return f" of {_number(low)} {many}"
    if low is not None and high is not None:
        return f" of {_number(low)} to {_number(high)} {many}"
    return f" of at most {_number(high)} {many}" if high is not None else f" of at least {_number(low)} {many}"


def describe(node: Schema) -> str:
    """What one schema alternative takes, in words: `an integer from 1 to 64`."""
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(str(v) for v in node["enum"])
    kind = node.get("type")
    if kind == "integer":
        return "an integer" + _range(node, integer=True)
    if kind == "number":
        return "a number" + _range(node, integer=False)
    if kind == "boolean":
        return "true or false"
    if kind == "string":
        return "text" + _count(node.get("minLength"), node.get("maxLength"), "character")
    if kind == "array":
        return "a list" + _count(node.get("minItems"), node.get("maxItems"), "item")
    if kind == "object" and node.get("properties"):
        required = list(node.get("required") or [])
        optional = [name for name in node["properties"] if name not in required]
        text = "a mapping with " + ", ".join(required or ["fields"])
        return text + (f" (optional: {', '.join(optional)})" if optional else "")
    return "a mapping" if kind == "object" else "a value"


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= SHOWN_INPUT else text[: SHOWN_INPUT - 3] + "..."


def _takes(nodes: Sequence[Schema], error: Mapping[str, Any]) -> str:
    if nodes:
        return " or ".join(dict.fromkeys(describe(node) for node in nodes))
    ctx = error.get("ctx") or {}  # no model (a query parameter): the bound pydantic names
    bounds = {"gt": "greater than", "ge": "at least", "lt": "less than", "le": "at most"}
    said = [f"{words} {_number(ctx[key])}" for key, words in bounds.items() if key in ctx]
    kind = str(error.get("type", ""))
    if kind in ("too_long", "too_short", "string_too_long", "string_too_short"):
        unit = "character" if kind.startswith("string") else "item"
        return ("text" if unit == "character" else "a list") + _count(
            ctx.get("min_length"), ctx.get("max_length"), unit)
    limits = [ctx[key] for key in bounds if key in ctx]
    noun = ("an integer" if kind.startswith("int") or limits and all(isinstance(b, int) for b in limits)
            else "a number" if kind.startswith("float") or limits
            else "true or false" if kind.startswith("bool") else "text" if kind.startswith("str")
            else "a valid value")
    return noun + (" " + " and ".join(said) if said else "")


def _union_tag(part: Any) -> bool:
    """pydantic's name of a union's alternative in a path (`int`, `function-wrap[f()]`,
    `DatasetRef`): field names are lowercase words."""
    return isinstance(part, str) and bool(part) and (
        part[0].isupper() or "[" in part or part in _TAGS)


_TAGS = frozenset({"int", "str", "float", "bool", "none", "constrained-int", "constrained-str",
                   "constrained-float", "list", "dict", "tuple"})


def reword(
    errors: Sequence[Mapping[str, Any]], model: type[BaseModel] | None
) -> list[Mapping[str, Any]]:
    """`errors` with pydantic's generic messages replaced by what the field takes; one message
    per field (a union's alternatives each fail with their own, the same field said once)."""
    out: list[Mapping[str, Any]] = []
    said: set[tuple[Any, ...]] = set()
    for error in errors:
        kind = str(error.get("type", ""))
        if kind not in _TYPE_ERRORS | _BOUND_ERRORS | {"missing"}:
            out.append(error)
            continue
        loc = tuple(error.get("loc", ()))
        path = loc[1:] if loc[:1] == ("body",) else loc
        nodes = nodes_at(model, path) if loc[:1] == ("body",) else []
        where = tuple(part for part in loc if not _union_tag(part))
        if where in said:
            continue
        said.add(where)
        if kind == "missing":
            message = f"required: give {_takes(nodes, error)}"
        else:
            given = error.get("input")  # a query's or a path's value is text as typed
            shown = given if loc[:1] in (("query",), ("path",)) and isinstance(given, str) else _shown(given)
            message = f"must be {_takes(nodes, error)}; got {shown}"
        out.append({**error, "loc": where, "msg": message})
    return out
