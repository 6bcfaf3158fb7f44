"""A small kombu transport that keeps the broker's queues in one SQLite file.

It is the embedded default broker (no server to run): ``sqlite:///<ACCUM_HOME>/broker.sqlite``.
kombu's own ``sqla+sqlite`` transport forwards every transport option to ``create_engine``
(so the ``polling_interval`` we need for low latency breaks it) and never deletes delivered
messages; this one is a plain table, a message is removed when a consumer takes it.

Delivery guarantees are kombu's virtual-transport ones: an unacknowledged message is put
back when its consumer shuts down cleanly, and lost when the consumer is killed. That is
enough here because the broker only carries a nudge: the job row and its lease in the
database are what recovers a job whose worker died (see ``services.housekeeping.reaper``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.utils.json import dumps, loads

SCHEME = "sqlite"
DEFAULT_POLLING_INTERVAL_S = 0.02
_SOURCE = "sqlite_source_queue"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS broker_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS broker_messages_queue_id ON broker_messages (queue, id);
"""


def database_path(virtual_host: str) -> Path:
    """The file kombu parsed out of the URL: ``sqlite:////abs/b.sqlite`` -> ``/abs/b.sqlite``,
    ``sqlite:///rel/b.sqlite`` -> ``rel/b.sqlite`` (SQLAlchemy's convention)."""
    if not virtual_host or virtual_host == "/":
        raise ValueError(
            "the embedded broker URL needs a file path, e.g. "
            "ACCUM_BROKER_URL=sqlite:////var/lib/accum/broker.sqlite"
        )
    return Path(virtual_host)


class Channel(virtual.Channel):
    """One SQLite connection per channel; every statement is its own transaction."""

    _connection: sqlite3.Connection | None = None

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._lock = threading.Lock()

    @property
    def db(self) -> sqlite3.Connection:
        if self._connection is None:
            vhost = self.connection.client.virtual_host or ""
            path = database_path(vhost)
            path.parent.mkdir(parents=True, exist_ok=True)
            # check_same_thread=False: the API enqueues from a thread pool; the lock serialises.
            conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
            # WAL lets publishers write while consumers poll without "database is locked".
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            self._connection = conn
        return self._connection

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            return self.db.execute(sql, params).fetchall()

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        _ = self.db  # opening the connection creates the table; queues are implicit

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return True

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self._execute(
            "INSERT INTO broker_messages (queue, payload) VALUES (?, ?)", (queue, dumps(message))
        )

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        # One statement takes the oldest message and removes it, so two consumers never get
        # the same one.
        rows = self._execute(
            "DELETE FROM broker_messages WHERE id = (SELECT id FROM broker_messages "
            "WHERE queue = ? ORDER BY id LIMIT 1) RETURNING payload",
            (queue,),
        )
        if not rows:
            raise Empty()
        message: dict[str, Any] = loads(rows[0][0])
        # Remember the source queue: restoring an unacked message then needs no exchange
        # bindings in this process (kombu keeps those in memory, per process).
        message.setdefault("properties", {}).setdefault("delivery_info", {})[_SOURCE] = queue
        return message

    def _restore(self, message: Any) -> None:
        queue = message.delivery_info.get(_SOURCE)
        if not queue:
            super()._restore(message)
            return
        payload = message.serializable()
        payload["redelivered"] = True
        self._put(queue, payload)

    def _size(self, queue: str) -> int:
        return int(self._execute("SELECT COUNT(*) FROM broker_messages WHERE queue = ?", (queue,))[0][0])

    def _purge(self, queue: str) -> int:
        return len(self._execute("DELETE FROM broker_messages WHERE queue = ? RETURNING id", (queue,)))

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self._purge(queue)

    def close(self) -> None:
        super().close()
        if self._connection is not None:
            self._connection.close()
            self._connection = None


# Set when the worker starts a warm shutdown (``stop_polling``): an idle consumer then leaves
# its poll at once instead of sleeping out Celery's 2 s drain timeout, so SIGTERM on an idle
# worker (``accum up`` / ``make demo`` stopping) returns promptly.
_stopping = threading.Event()


def stop_polling(**_signal_kwargs: Any) -> None:
    """Make idle ``drain_events`` calls in this process return now (a Celery signal receiver)."""
    _stopping.set()


def resume_polling() -> None:
    """Undo ``stop_polling`` (a worker started again in the same process)."""
    _stopping.clear()


class Transport(virtual.Transport):
    """The embedded SQLite transport (``sqlite:///path``)."""

    Channel = Channel
    polling_interval = DEFAULT_POLLING_INTERVAL_S
    default_port = None
    driver_type = "sqlite"
    driver_name = "sqlite3"
    connection_errors = (sqlite3.OperationalError,)
    channel_errors = (sqlite3.OperationalError,)

    def driver_version(self) -> str:
        return sqlite3.sqlite_version

    def drain_events(  # type: ignore[override]  # kombu's virtual transport signature
        self, connection: Any, timeout: float | None = None
    ) -> None:
        """kombu's polling loop, but an empty poll after ``stop_polling`` ends it at once
        (as a timeout, which Celery's consumer loop expects) instead of polling on."""
        started = time.monotonic()
        interval = self.polling_interval
        if timeout and interval and interval > timeout:
            interval = timeout
        cycle = self.cycle
        assert cycle is not None  # set up by virtual.Transport.__init__
        while True:
            try:
                cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                if _stopping.is_set() or (
                    timeout is not None and time.monotonic() - started >= timeout
                ):
                    raise TimeoutError() from None
                if interval is not None:
                    time.sleep(interval)


def register() -> None:
    """Make ``sqlite://`` broker URLs resolve to this transport (idempotent)."""
    TRANSPORT_ALIASES.setdefault(SCHEME, f"{__name__}:Transport")
