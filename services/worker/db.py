"""One engine and session factory per process and database URL, shared by worker parts."""

from __future__ import annotations

import os
import threading
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from services.store.db import make_engine, make_session_factory

_factories: dict[tuple[int, str], sessionmaker[Session]] = {}
_lock = threading.Lock()


def session_factory(settings: Any) -> sessionmaker[Session]:
    # Keyed by pid too: a forked child must not reuse its parent's pooled connections.
    key = (os.getpid(), str(settings.database_url))
    factory = _factories.get(key)
    if factory is None:
        with _lock:
            factory = _factories.get(key)
            if factory is None:
                factory = _factories[key] = make_session_factory(make_engine(settings))
    return factory
