"""Apply Alembic migrations from code: ``accum db upgrade``, ``accum up``, tests.

The API does not migrate at start-up:
run ``accum db upgrade`` (``accum up`` does) before starting it.

    from services.jobdb.migrate import upgrade
    upgrade(settings.database_url)            # to head; idempotent
    downgrade(settings.database_url, "base")  # drop everything

The scripts ship inside the package (``services/migrations`` in the wheel; ``migrations/`` at the
top of the repository): ``services.packaged`` finds them.
"""

from __future__ import annotations

import warnings
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from services.jobdb.db import make_engine
from services.jobdb.models import Base
from services.packaged import packaged_dir

MIGRATIONS_DIR = packaged_dir("migrations")


def alembic_config(database_url: str) -> Config:
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise FileNotFoundError(
            f"Alembic migrations not found at {MIGRATIONS_DIR}: this accum was installed without "
            "its package data; reinstall it from a wheel (pip install accum-*.whl) or a checkout"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation: a literal % in a URL (encoded password) must be doubled.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Migrate the database up to ``revision`` (creates the schema on an empty database)."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    """Migrate down to ``revision`` (``base`` drops every table accum created)."""
    command.downgrade(alembic_config(database_url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(database_url: str) -> str | None:
    """The revision the database is at (None for an empty database)."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def schema_drift(database_url: str) -> list[Any]:
    """Differences autogenerate finds between the models and the migrated database ([] = none)."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection, warnings.catch_warnings():
            # SQLite's inspector cannot read expression indexes (ix_jobs_owner_id_short), so
            # autogenerate leaves them out there, saying so each time; PostgreSQL compares them.
            warnings.filterwarnings("ignore", message=".*expression-based index")
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()
