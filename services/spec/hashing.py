"""A stable fingerprint of a normalised spec, for idempotent job submission."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def canonical_json(normalised: Mapping[str, Any]) -> str:
    """Sorted keys, no whitespace: the same spec always gives the same text."""
    return json.dumps(
        normalised, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def spec_hash(normalised: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical JSON of a normalised spec (`JobSpec.normalised()`).

    Hash the normalised form, not the submitted body, so `"model": "mlp"` and
    `"model": {"name": "mlp"}`, or a default written out, give the same hash.
    """
    return hashlib.sha256(canonical_json(normalised).encode()).hexdigest()
