"""Column types and value helpers shared by the models: UTC timestamps and time-ordered ids."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

# Crockford base32 in ascending ASCII order, lower case: ids sort by time as plain strings
# (byte order; the PostgreSQL databases here use C collation) and are safe in file paths.
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
ID_LEN = 26
# A job's short id: the last characters of its id, 30 of its random bits (the first ten
# characters are the creation time, so prefixes of them name every job of a few minutes).
# The random part counts up inside one millisecond: its tail still differs between two ids.
SHORT_LEN = 6
_id_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    """A 26-character ULID-style id: 48 bits of milliseconds, then 80 random bits.

    Within one process ids are strictly increasing (the random part counts up inside a
    millisecond), so ``ORDER BY id DESC`` is newest first and keyset pagination by id is stable.
    """
    global _last_ms, _last_rand
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms, rand = _last_ms, _last_rand + 1
        else:
            rand = int.from_bytes(os.urandom(10), "big") >> 1  # room to count up
        _last_ms, _last_rand = ms, rand
    value = (ms << 80) | (rand & ((1 << 80) - 1))
    chars = []
    for _ in range(ID_LEN):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    SQLite has no time zone type and hands back naive values; storing naive UTC there and
    re-attaching UTC on the way out lets Python compare lease times the same way everywhere.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware UTC datetime (utcnow())")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
