"""Readiness probes: can this process reach its database and its broker right now?

Each probe runs in a worker thread under a short deadline, so a black-holed host makes
`/readyz` answer 503 in about a second instead of hanging the load balancer's check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis
from kombu import Connection
from sqlalchemy import Engine, text

from services.dispatch import sqlite_transport
from services.jobdb.db import first_line, retry_if_dropped

PROBE_TIMEOUT_S = 1.5


def ping_database(engine: Engine) -> None:
    """SELECT 1; once more on a new connection when the pooled one was dropped (the API's
    pool has no pre-ping: after a database restart the first use of each finds it dead)."""
    retry_if_dropped(lambda: _select_one(engine))


def _select_one(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def ping_broker(url: str) -> None:
    if url.startswith(("redis://", "rediss://")):
        client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
        try:
            client.ping()
        finally:
            client.close()
        return
    # Other transports (the embedded SQLite one included) through kombu, which knows them all.
    sqlite_transport.register()
    with Connection(url, connect_timeout=1.0) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=1.0)


async def probe(check: Callable[[], None], timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when `check` succeeds in time, else a one-line reason."""
    try:
        await asyncio.wait_for(asyncio.to_thread(check), timeout_s)
    except TimeoutError:
        return f"no answer within {timeout_s:g}s"
    except Exception as exc:  # any failure means "not ready"; the reason goes to the caller
        return f"{type(exc).__name__}: {first_line(exc, 300)}"[:300]
    return None
