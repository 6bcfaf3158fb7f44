"""Engine and session factory from Settings, tuned for several processes writing at once.

The API process, every worker and the reaper write the same database. On SQLite that needs
WAL (readers never block the writer), a busy timeout (writers queue instead of failing with
"database is locked") and foreign keys switched on (SQLite leaves them off by default).

Usage::

    engine = make_engine(settings)
    Session = make_session_factory(engine)
    with Session.begin() as session:   # commits on success, rolls back on error
        job, created = jobs.create_job(session, owner=owner, spec=spec)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from services.settings import Settings

T = TypeVar("T")

# A request made while PostgreSQL is down must fail fast (the API answers 503), not hang on
# a connect to a host that does not answer. libpq's minimum is 2 s; a refused connection (the
# server stopped) fails at once anyway.
CONNECT_TIMEOUT_S = 2
# psycopg prepares a statement after 5 runs, and PostgreSQL then may switch it to a generic
# plan that cannot see the parameters' values. For a metrics page (`name IN (...) AND step >
# $since`) the generic plan walks the job's whole history (9 ms at 280,000 rows, growing)
# instead of one short range per name (0.3 ms): bench/service/load.py's GET p99 went from 7 ms to
# 600+ ms as a job's history grew. Planning with the values costs ~0.05 ms a statement.
CUSTOM_PLANS = "-c plan_cache_mode=force_custom_plan"


def database_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means "the database cannot be reached or is busy right now" (server
    down or restarting, connection dropped, pool exhausted, SQLite locked): a transient error
    to answer with 503 or to retry, unlike a bad query or a constraint violation."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError | InterfaceError | PoolTimeout)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an error's message, cut to ``limit``: what a log line or a 503 quotes
    (a driver's message can run to a dozen lines of context)."""
    return (str(exc).strip().splitlines() or [""])[0][:limit]


def retry_if_dropped(statement: Callable[[], T], before_retry: Callable[[], None] | None = None) -> T:
    """Run ``statement``; once more when its connection turned out to be one the database
    dropped (a restart, an idle timeout: the engine then renews the pool's older connections).
    For a caller's first statement, which is safe to repeat, on an engine without pre-ping.
    A database that is really down fails again."""
    try:
        return statement()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        if before_retry is not None:
            before_retry()
        return statement()


def make_engine(
    settings: Settings | str, *, busy_timeout_s: float | None = None, pre_ping: bool = True
) -> Engine:
    """An engine for ``settings.database_url`` (or a URL string).

    SQLite: creates the file's directory, WAL, busy timeout, foreign keys.
    PostgreSQL (``postgresql+psycopg://``): a pool sized for one API process under load.
    ``pre_ping=False`` drops the pool's liveness check on checkout (one round trip) for a
    caller whose first statement retries on a dropped connection itself (the API's auth).
    """
    if isinstance(settings, Settings):
        url, timeout = settings.database_url, settings.sqlite_busy_timeout_s
    else:
        url, timeout = settings, 30.0
    if busy_timeout_s is not None:
        timeout = busy_timeout_s
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url, parsed.database, timeout)
    # pool_pre_ping: connections that a database restart killed are replaced on checkout
    # instead of failing the request that draws them.
    return create_engine(
        url,
        pool_pre_ping=pre_ping,
        pool_size=10,
        max_overflow=30,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "options": CUSTOM_PLANS},
    )


def _sqlite_engine(url: str, database: str | None, timeout_s: float) -> Engine:
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    # check_same_thread=False: FastAPI runs sync routes in a thread pool; the pool hands each
    # connection to one thread at a time. timeout: sqlite3's own busy handler.
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": timeout_s},
        pool_size=8,
        max_overflow=16,
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        # NORMAL is durable across process crashes in WAL mode (only an OS crash can lose the
        # last transactions), and much faster than FULL for the metric batches.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: routes and the worker read attributes of returned rows after the
    # transaction has committed.
    return sessionmaker(engine, expire_on_commit=False)
