"""One engine and session factory per process and database URL, shared by the worker's parts
and the lease reaper (the API builds its own, sized for its route threads)."""

from __future__ import annotations

import os
import threading

from sqlalchemy.orm import Session, sessionmaker

from services.jobdb.db import make_engine, make_session_factory
from services.settings import Settings

_factories: dict[tuple[int, str], sessionmaker[Session]] = {}
_lock = threading.Lock()


def session_factory(settings: Settings) -> sessionmaker[Session]:
    # Keyed by pid too: a forked child must not reuse its parent's pooled connections.
    key = (os.getpid(), str(settings.database_url))
    factory = _factories.get(key)
    if factory is None:
        with _lock:
            factory = _factories.get(key)
            if factory is None:
                factory = _factories[key] = make_session_factory(make_engine(settings))
    return factory
