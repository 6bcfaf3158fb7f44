"""Shared fixtures: real PostgreSQL and Redis, and the database matrix.

Tests that need a service ask for its fixture. When the service is unreachable the test is
skipped with the command that starts it, unless ACCUM_REQUIRE_SERVICES=1 (as .ci/run sets),
in which case it fails: CI must never pass by skipping integration tests.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
from durations_record import pytest_addoption, pytest_configure  # noqa: F401  (--durations-record)
from skips import services_required
from slow_rule import pytest_collection_modifyitems as slow_rule_check
from worker_stack import stack  # noqa: F401  (the fixture, for integration and reliability tests)

# No test reads or writes the user's own per-user record (`accum up` writes
# $XDG_CONFIG_HOME/accum/local.json and the CLI and AccumClient() read it): each test process
# (each xdist worker) gets a folder of its own, which the subprocesses it starts inherit.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="accum-test-config-")

POSTGRES_ADMIN_URL = os.environ.get(
    "ACCUM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("ACCUM_TEST_REDIS_URL", "redis://127.0.0.1:6379")

HOW_TO_START = {
    "postgresql": "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
    "redis": "start it with: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no",
}


# The backend sweeps: every test that takes one of these parameters runs once per backend in
# `make test`; `make test-fast` runs the case named here (for the database and the stack, the
# one that needs no server: SQLite as database and broker; for the worker's pool, prefork, the
# one with more moving parts), and the others are marked ``sweep``.
FAST_LANE_CASES = {"database_backend": "sqlite", "stack": "sqlite", "pool": "prefork"}
# A module's own stack fixture parametrised over the deployments (tests/integration/test_job_logs.py's
# ``chatty``) is a backend sweep too, whatever its name: its server cases are marked ``sweep``.
SERVER_CASES = {"postgresql", "postgres_redis"}


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the other backends' cases of each backend sweep ``sweep`` (see FAST_LANE_CASES), then
    fail the collection if a test slower than a minute in the record is not marked ``slow``."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(name in params and params[name] != case for name, case in FAST_LANE_CASES.items()) or any(
            name not in FAST_LANE_CASES and isinstance(value, str) and value in SERVER_CASES
            for name, value in params.items()
        ):
            item.add_marker(pytest.mark.sweep)
    slow_rule_check(session, config, items)


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 2
        ):
            return True
    except OSError:
        return False


def require_service(name: str, url: str, default_port: int) -> None:
    """Skip (or fail, under ACCUM_REQUIRE_SERVICES=1) when a real service is unreachable."""
    if _reachable(url, default_port):
        return
    message = f"{name} is not reachable at {url}; {HOW_TO_START[name]}"
    if services_required():
        pytest.fail(f"ACCUM_REQUIRE_SERVICES=1 but {message}")
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    require_service("postgresql", POSTGRES_ADMIN_URL, 5432)
    return POSTGRES_ADMIN_URL


@contextlib.contextmanager
def fresh_postgres_database(server_url: str) -> Iterator[str]:
    """A new, empty PostgreSQL database on the server of ``server_url``, dropped afterwards."""
    from sqlalchemy import create_engine, text

    name = f"accum_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    base = server_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test session, dropped afterwards."""
    with fresh_postgres_database(postgres_server_url) as url:
        yield url


@pytest.fixture(scope="session")
def stack_postgres_url(postgres_server_url: str) -> Iterator[str]:
    """The worker stacks' own database (tests/worker_stack.py): their live workers register
    themselves there, and a registered fleet changes what the API accepts (a queue no worker
    serves is refused), so they must not share the API tests' database."""
    with fresh_postgres_database(postgres_server_url) as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A Redis database number for this test session (flushed before use)."""
    require_service("redis", REDIS_URL, 6379)
    import redis

    # One database per pytest-xdist worker (gw0 -> 9, gw1 -> 10, ...): flushing it must not
    # empty the queues of another worker's tests.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    number = int(os.environ.get("ACCUM_TEST_REDIS_DB", "9")) + (int(worker) if worker.isdigit() else 0)
    url = f"{REDIS_URL.rstrip('/')}/{number}"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def accum_home(tmp_path: Path) -> Path:
    home = tmp_path / "accum-home"
    home.mkdir()
    return home


# --- the job store on both backends (owned by the store engineer) -------------------------
#
# database_url      function  a migrated, EMPTY database for `database_backend` (sqlite: a copy
#                             of a migrated template file under accum_home; postgresql: the
#                             session's database, migrated once, rows deleted per test)
# store_settings    function  Settings(home=accum_home, database_url=database_url); broker and
#                             artefacts default under accum_home
# db_engine         function  services.jobdb.make_engine(store_settings), disposed afterwards
# session_factory   function  sessionmaker bound to db_engine: `with session_factory.begin() as s:`
#
# Any test that asks for one of these runs twice, once per backend (ids [sqlite], [postgresql]).

if TYPE_CHECKING:  # imported lazily below: collecting unrelated tests stays fast
    from s3_server import S3Server
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session, sessionmaker

    from services.settings import Settings

STORE_TABLES = (
    "auth_failures",
    "metrics",
    "metric_blocks",
    "checkpoints",
    "job_events",
    "job_attempts",
    "tracker_runs",
    "jobs",
    "workers",
    "api_tokens",
    "owners",
)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite file per session; tests get copies (faster than migrating each)."""
    from services.jobdb.migrate import upgrade

    path = tmp_path_factory.mktemp("store-template") / "accum.sqlite"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def migrated_postgres_url(postgres_url: str) -> str:
    """The session's PostgreSQL database with the schema at head."""
    from services.jobdb.migrate import upgrade

    upgrade(postgres_url)
    return postgres_url


@pytest.fixture
def database_url(database_backend: str, accum_home: Path, request: pytest.FixtureRequest) -> str:
    """A migrated, empty database for this test on `database_backend`."""
    if database_backend == "sqlite":
        import shutil

        template: Path = request.getfixturevalue("sqlite_template")
        target = accum_home / "accum.sqlite"
        shutil.copyfile(template, target)
        return f"sqlite:///{target}"
    url: str = request.getfixturevalue("migrated_postgres_url")
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    # DELETE, children first: much faster than TRUNCATE on tables this small.
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            for table in STORE_TABLES:
                conn.execute(text(f"DELETE FROM {table}"))
    finally:
        engine.dispose()
    return url


@pytest.fixture
def store_settings(accum_home: Path, database_url: str) -> Settings:
    """Settings for this test: home = accum_home, database = `database_url` (migrated, empty)."""
    from services.settings import Settings

    return Settings(home=accum_home, database_url=database_url)


@pytest.fixture
def db_engine(store_settings: Settings) -> Iterator[Engine]:
    """`services.jobdb.make_engine(store_settings)`, disposed after the test."""
    from services.jobdb.db import make_engine

    engine = make_engine(store_settings)
    yield engine
    engine.dispose()


@pytest.fixture
def session_factory(db_engine: Engine) -> sessionmaker[Session]:
    """Sessions on `db_engine`; `with session_factory.begin() as session:` commits on success."""
    from services.jobdb.db import make_session_factory

    return make_session_factory(db_engine)


# --- an S3-compatible server (moto, server mode) for artifact store tests -----------------


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 on a free localhost port for the session, with the test bucket."""
    from s3_server import S3Server

    server = S3Server()
    server.start()
    server.create_bucket()
    yield server
    server.stop()


@pytest.fixture
def s3_url(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty ``s3://`` prefix on the test server, with the AWS environment pointing there."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    s3_server.ensure_running()  # a test that stopped it may have failed before restarting
    return s3_server.url()


@pytest.fixture(params=["local", "s3"])
def artifacts_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty artifact store, once as a local directory and once on S3."""
    if request.param == "local":
        return (tmp_path / "store").as_uri()
    return str(request.getfixturevalue("s3_url"))
