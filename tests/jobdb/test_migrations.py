"""Alembic migrations: upgrade and downgrade on SQLite and PostgreSQL, and no drift from the
models (autogenerate finds nothing to add)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Connection, create_engine, inspect, text
from sqlalchemy.orm import Session

from services.jobdb import migrate
from services.jobdb.jobs import load_job
from services.jobdb.models import Base
from services.jobdb.status import JobStatus


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


def insert_owner_and_jobs(conn: Connection, statuses: dict[str, str]) -> None:
    """Owner 1 and a job per id with the given status, in the first migration's columns."""
    conn.execute(text("INSERT INTO owners (id, name, is_admin, created_at) "
                      "VALUES (1, 'o', false, CURRENT_TIMESTAMP)"))
    for job_id, status in statuses.items():
        conn.execute(text(
            "INSERT INTO jobs (id, owner_id, spec, spec_hash, status, queue, attempts, "
            "restarts, max_restarts, progress, latest_metrics, created_at, updated_at) "
            "VALUES (:id, 1, '{\"model\": \"mlp\"}', 'h', :status, 'default', 1, 0, 3, "
            "'{}', '{\"val_accuracy\": 0.9}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"),
            {"id": job_id, "status": status})


def test_0006_turns_checkpoint_paths_into_store_keys(empty_database_url: str) -> None:
    """Rows written before the artifact store held the worker's absolute path (or a file://
    URL); after 0006 each holds ``<job>/<step>.pt``, whatever the path was."""
    migrate.upgrade(empty_database_url, "0005")
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            insert_owner_and_jobs(conn, {"j1": "succeeded"})
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


def test_0013_carries_the_micro_batch_choice_from_its_event_to_the_job(empty_database_url: str) -> None:
    """Before 0013 a job's ``micro_batch_size: "auto"`` choice was its latest
    ``micro_batch_chosen`` event; after it, the job row holds it (a job that never chose holds
    null), so a job's next attempt keeps the (m, N) it chose before the upgrade."""
    migrate.upgrade(empty_database_url, "0012")
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            insert_owner_and_jobs(conn, {"j1": "running", "j2": "queued"})
            for micro, steps in ((32, 1), (8, 4)):  # the latest one is the job's choice
                conn.execute(text(
                    "INSERT INTO job_events (job_id, attempt, kind, message, data, created_at) "
                    "VALUES ('j1', 1, 'micro_batch_chosen', '', :data, CURRENT_TIMESTAMP)"),
                    {"data": f'{{"micro_batch_size": {micro}, "accumulation_steps": {steps}}}'})
        migrate.upgrade(empty_database_url)
        with Session(engine) as session:
            chosen = {job.id: job.micro_batch_chosen for job in (load_job(session, "j1"), load_job(session, "j2"))
                      if job is not None}
        assert chosen == {"j1": {"micro_batch_size": 8, "accumulation_steps": 4}, "j2": None}
        migrate.downgrade(empty_database_url, "0012")
        assert "micro_batch_chosen" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()


UPGRADE_IN_A_NEW_RELEASE = (
    "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout);"
    "from services.cli.main import main; sys.exit(main(['db', 'upgrade']))"
)


def run_migrate_service(url: str) -> str:
    """What the compose file's `migrate` service runs (`accum db upgrade`), as its own process."""
    env = {**os.environ, "ACCUM_DATABASE_URL": url}
    result = subprocess.run([sys.executable, "-c", UPGRADE_IN_A_NEW_RELEASE], env=env,
                            capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout + result.stderr


@pytest.mark.parametrize("database_backend", ["postgresql"])
def test_a_new_release_migrates_a_database_holding_jobs_once_and_keeps_them(
    empty_database_url: str,
) -> None:
    """A stack deployed at the first migration, holding a queued and a finished job (with its
    checkpoint and events), brought up by a newer release: its migrate service takes the
    database to head, every job is kept with its status, and a second start migrates nothing."""
    migrate.upgrade(empty_database_url, "0001")
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            insert_owner_and_jobs(conn, {"queued1": "queued", "done1": "succeeded"})
            conn.execute(text(
                "INSERT INTO checkpoints (job_id, step, attempt, uri, size_bytes, sha256, "
                "metrics, is_best, created_at) VALUES ('done1', 40, 1, "
                "'/srv/accum/artifacts/done1/40.pt', 7, 'abc', '{}', true, CURRENT_TIMESTAMP)"))
            conn.execute(text(
                "INSERT INTO job_events (job_id, attempt, kind, message, data, created_at) "
                "VALUES ('done1', 1, 'succeeded', 'done', '{}', CURRENT_TIMESTAMP)"))

        first = run_migrate_service(empty_database_url)
        assert "Running upgrade 0001 -> 0002" in first
        assert f"-> {migrate.head_revision()}," in first
        assert migrate.current_revision(empty_database_url) == migrate.head_revision()
        assert migrate.schema_drift(empty_database_url) == []
        second = run_migrate_service(empty_database_url)
        assert "Running upgrade" not in second, "an up-to-date database is migrated once only"

        with Session(engine) as session:
            queued, done = load_job(session, "queued1"), load_job(session, "done1")
            assert queued is not None and done is not None
            assert (queued.status, done.status) == (JobStatus.QUEUED, JobStatus.SUCCEEDED)
            assert done.latest_metrics == {"val_accuracy": 0.9} and queued.spec == {"model": "mlp"}
            assert queued.priority == 1 and queued.run_seconds == 0  # later columns' defaults
        with engine.connect() as conn:
            keys = conn.execute(text("SELECT key FROM checkpoints")).scalars().all()
            events = conn.execute(text("SELECT count(*) FROM job_events")).scalar_one()
        assert keys == ["done1/40.pt"] and events == 1
    finally:
        engine.dispose()
