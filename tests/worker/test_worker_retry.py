"""Worker writes wait out a database outage (services/worker/retry.py): connection errors
are retried until the write succeeds, the time is up or the lease is lost; any other error is
raised at once. (A real PostgreSQL restart: tests/reliability/test_postgres_restart.py.)"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from services.worker.retry import retry_while_unreachable


def refused() -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception("connection refused"))


def failing(times: int, error: Callable[[], Exception] = refused) -> Callable[[], str]:
    calls = {"n": 0}

    def write() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise error()
        return f"written on try {calls['n']}"

    return write


def test_a_write_is_retried_until_the_database_answers() -> None:
    assert retry_while_unreachable(failing(3), what="test", for_s=10) == "written on try 4"


def test_other_errors_are_not_retried() -> None:
    write = failing(1, lambda: IntegrityError("INSERT", {}, Exception("duplicate key")))
    with pytest.raises(IntegrityError):
        retry_while_unreachable(write, what="test", for_s=10)
    assert write() == "written on try 2"  # it was tried once


def test_it_gives_up_when_the_time_is_up() -> None:
    started = time.monotonic()
    with pytest.raises(OperationalError):
        retry_while_unreachable(failing(1000), what="test", for_s=0.5)
    assert time.monotonic() - started < 1.5


def test_it_gives_up_when_the_lease_is_lost() -> None:
    lost = {"now": False}

    def write() -> None:
        lost["now"] = True  # the heartbeat found the lease gone during the first try
        raise refused()

    with pytest.raises(OperationalError):
        retry_while_unreachable(write, what="test", for_s=60, give_up=lambda: lost["now"])
