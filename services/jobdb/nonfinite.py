"""Non-finite metric values (NaN, inf, -inf): how the store keeps them and how they are named.

JSON has no NaN or infinity, and SQLite turns a NaN into NULL, so the store keeps:
- a metric row's ``value``: ``+inf``/``-inf`` as themselves, NaN as NULL (a NULL value is a NaN);
- a job's ``latest_metrics`` (a JSON column): a non-finite value as its label, ``"NaN"``,
  ``"inf"`` or ``"-inf"``.

The API answers such a value as ``null`` (numbers stay numbers for clients that read them)
with the label beside it (``nonfinite`` on a metric point, ``nonfinite_metrics`` on a job), so
a diverged run reads "NaN", never a blank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

Label = Literal["NaN", "inf", "-inf"]
LABELS: frozenset[str] = frozenset({"NaN", "inf", "-inf"})


def label(value: Any) -> Label | None:
    """``"NaN"``, ``"inf"`` or ``"-inf"`` for a non-finite number, a stored NULL (NaN) or a
    stored label; None for a finite number."""
    if value is None:
        return "NaN"
    if isinstance(value, str):
        return value if value in LABELS else None  # type: ignore[return-value]
    if isinstance(value, int | float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return None


def json_safe(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each non-finite float replaced by its label (for a JSON column)."""
    return {
        k: label(v) if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in values.items()
    }


def split_latest(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Label]]:
    """A stored ``latest_metrics`` as (numbers with None where non-finite, labels of those)."""
    numbers: dict[str, Any] = {}
    labels: dict[str, Label] = {}
    for name, value in values.items():
        named = label(value) if isinstance(value, float | str) else None
        if named is not None:
            numbers[name], labels[name] = None, named
        else:
            numbers[name] = value
    return numbers, labels
