"""The dialect-specific INSERT (for ON CONFLICT), chosen from the session's bind."""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def insert_for(session: Session, table: Any) -> Any:
    """``insert(table)`` with ``on_conflict_do_nothing/do_update`` for SQLite or PostgreSQL."""
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"database {name!r} is not supported; use SQLite or PostgreSQL")
