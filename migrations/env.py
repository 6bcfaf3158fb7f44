"""Alembic environment for accum (SQLite and PostgreSQL).

The database URL comes from, in order: ``-x url=...`` on the alembic command line, the
config's ``sqlalchemy.url`` (set by ``services.jobdb.migrate``), then ``Settings`` (the
``ACCUM_DATABASE_URL`` / ``ACCUM_HOME`` environment). SQLite runs in batch mode because it
cannot ALTER most things in place.

Concurrent upgrades (the API and a worker starting together on a fresh database) are
serialised: a PostgreSQL advisory lock, or a lock file next to the SQLite database. The later
one then finds the schema at head and does nothing.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import context
from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

from services.settings import get_settings
from services.jobdb.db import make_engine
from services.jobdb.models import Base

config = context.config
MIGRATION_LOCK_ID = 0x616363756D  # "accum": any constant shared by every accum process
target_metadata = Base.metadata


def database_url() -> str:
    return (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
        or get_settings().database_url
    )


def run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Held until this transaction ends; PostgreSQL runs the whole upgrade in it.
            connection.execute(text(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_ID})"))
        context.run_migrations()


@contextmanager
def sqlite_file_lock(url: str) -> Iterator[None]:
    """An exclusive lock on ``<database>.migrate.lock`` (SQLite DDL is not transactional here)."""
    parsed = make_url(url)
    database = parsed.database if parsed.get_backend_name() == "sqlite" else None
    if not database or database == ":memory:" or database.startswith("file:"):
        yield
        return
    lock_path = Path(database).expanduser().with_name(Path(database).name + ".migrate.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def run_offline() -> None:
    url = database_url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:  # handed in by a caller that already holds one (tests)
        run_with(connection)
        return
    url = database_url()
    engine = make_engine(url)
    try:
        with sqlite_file_lock(url), engine.connect() as connection:
            run_with(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
