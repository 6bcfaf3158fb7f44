"""Alembic migrations: upgrade and downgrade on SQLite and PostgreSQL, and no drift from the
models (autogenerate finds nothing to add)."""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from services.store import migrate
from services.store.models import Base


@pytest.fixture
def empty_database_url(
    database_backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A database with no tables at all (a fresh file, or a new PostgreSQL database)."""
    if database_backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.sqlite'}"
        return
    server: str = request.getfixturevalue("postgres_server_url")
    name = f"accum_mig_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{server.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_creates_the_models_schema_and_downgrade_removes_it(
    empty_database_url: str,
) -> None:
    assert migrate.current_revision(empty_database_url) is None
    migrate.upgrade(empty_database_url)
    assert migrate.current_revision(empty_database_url) == migrate.head_revision()
    assert table_names(empty_database_url) == set(Base.metadata.tables) | {"alembic_version"}
    assert migrate.schema_drift(empty_database_url) == []

    migrate.upgrade(empty_database_url)  # idempotent: start-up may run it every time
    migrate.downgrade(empty_database_url, "base")
    assert migrate.current_revision(empty_database_url) is None
    assert table_names(empty_database_url) <= {"alembic_version"}

    migrate.upgrade(empty_database_url)  # and back up again from nothing
    assert migrate.schema_drift(empty_database_url) == []


def test_drift_is_detected(empty_database_url: str) -> None:
    """The drift check can fail: a column missing from the database is reported."""
    migrate.upgrade(empty_database_url)
    engine = create_engine(empty_database_url)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE jobs DROP COLUMN worker_gpu"))
    engine.dispose()
    drift = migrate.schema_drift(empty_database_url)
    assert any(diff[0] == "add_column" and diff[3].name == "worker_gpu" for diff in drift), drift


def _upgrade_in_child(url: str) -> None:
    migrate.upgrade(url)


def test_concurrent_upgrades_of_a_fresh_database_both_succeed(empty_database_url: str) -> None:
    """The API and a worker may start together on a new database: the migration is locked."""
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(target=_upgrade_in_child, args=(empty_database_url,)) for _ in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    assert migrate.current_revision(empty_database_url) == migrate.head_revision()
    assert migrate.schema_drift(empty_database_url) == []


def test_0006_turns_checkpoint_paths_into_store_keys(empty_database_url: str) -> None:
    """Rows written before the artifact store held the worker's absolute path (or a file://
    URL); after 0006 each holds ``<job>/<step>.pt``, whatever the path was."""
    migrate.upgrade(empty_database_url, "0005")
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO owners (id, name, is_admin, created_at) "
                              "VALUES (1, 'o', false, CURRENT_TIMESTAMP)"))
            conn.execute(text(
                "INSERT INTO jobs (id, owner_id, spec, spec_hash, status, queue, attempts, "
                "restarts, max_restarts, progress, latest_metrics, created_at, updated_at) "
                "VALUES ('j1', 1, '{}', 'h', 'succeeded', 'default', 1, 0, 3, '{}', '{}', "
                "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
            for step, uri in ((10, "/srv/accum/artifacts/j1/10.pt"),
                              (20, "file:///mnt/share/artifacts/j1/20.pt")):
                conn.execute(text(
                    "INSERT INTO checkpoints (job_id, step, attempt, uri, size_bytes, sha256, "
                    "metrics, is_best, created_at) VALUES ('j1', :step, 1, :uri, 1, 'x', '{}', "
                    "false, CURRENT_TIMESTAMP)"), {"step": step, "uri": uri})
        migrate.upgrade(empty_database_url)
        with engine.connect() as conn:
            keys = conn.execute(text("SELECT key FROM checkpoints ORDER BY step")).scalars().all()
        assert keys == ["j1/10.pt", "j1/20.pt"]
        migrate.downgrade(empty_database_url, "0005")
        with engine.connect() as conn:
            uris = conn.execute(text("SELECT uri FROM checkpoints ORDER BY step")).scalars().all()
        assert uris == ["j1/10.pt", "j1/20.pt"]  # relative: the older API reads it under its dir
    finally:
        engine.dispose()
