"""The engine: SQLite set up for several writing processes; the Alembic CLI finds its config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from services.jobdb.db import make_engine, make_session_factory
from services.jobdb.migrate import current_revision, head_revision
from services.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_sqlite_runs_in_wal_with_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "nested" / "home", sqlite_busy_timeout_s=7)
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 7000
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert (settings.home / "accum.sqlite").exists()  # its directory was created
    finally:
        engine.dispose()


def test_foreign_keys_are_enforced(db_engine: Engine) -> None:
    session_factory = make_session_factory(db_engine)
    with pytest.raises(IntegrityError), session_factory.begin() as session:
        session.execute(
            text(
                "INSERT INTO job_events (job_id, attempt, kind, message, data, created_at) "
                "VALUES ('missing', 0, 'x', '', '{}', CURRENT_TIMESTAMP)"
            )
        )


def test_alembic_command_line_uses_x_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.sqlite'}"
    subprocess.run(
        [sys.executable, "-m", "alembic", "-x", f"url={url}", "upgrade", "head"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert current_revision(url) == head_revision()


def test_postgres_plans_every_statement_with_its_values(postgres_url: str) -> None:
    """A prepared metrics page must not fall back to a generic plan that ignores `step >
    since_step` (it then reads the job's whole history on every poll)."""
    engine = make_engine(postgres_url)
    try:
        with engine.connect() as connection:
            for _ in range(8):  # past psycopg's prepare threshold (5)
                mode = connection.execute(text("SHOW plan_cache_mode")).scalar_one()
                assert mode == "force_custom_plan"
    finally:
        engine.dispose()
