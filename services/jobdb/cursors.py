"""Opaque keyset-pagination cursors: url-safe base64 of a small JSON list."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from services.jobdb.errors import InvalidCursor


def encode_cursor(*key: Any) -> str:
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, types: tuple[type, ...]) -> list[Any]:
    """Decode and check the shape: one value of each of ``types``, else InvalidCursor."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise InvalidCursor(cursor) from exc
    if (
        not isinstance(key, list)
        or len(key) != len(types)
        or not all(
            isinstance(v, t) and not isinstance(v, bool) for v, t in zip(key, types, strict=True)
        )
    ):
        raise InvalidCursor(cursor)
    return key
