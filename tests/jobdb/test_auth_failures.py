"""Failed token checks shared by every API process: recorded per address, read back newest
first within the window, older rows deleted as new ones come."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb.auth_failures import record_failure
from services.jobdb.models import AuthFailure

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_failures_come_back_as_ages_newest_first_within_the_window(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        assert record_failure(session, "a", 60, keep=5, now=at(0)) == [0.0]
        record_failure(session, "b", 60, keep=5, now=at(5))  # another address: not counted
        record_failure(session, "a", 60, keep=5, now=at(10))
        ages = record_failure(session, "a", 60, keep=5, now=at(30))

    assert ages == pytest.approx([0.0, 20.0, 30.0])


def test_only_the_newest_keep_come_back_and_old_rows_are_deleted(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        for second in range(0, 50, 10):  # 0, 10, 20, 30, 40
            record_failure(session, "a", 60, keep=3, now=at(second))
        assert record_failure(session, "a", 60, keep=3, now=at(45)) == pytest.approx([0, 5, 15])
        ages = record_failure(session, "a", 60, keep=10, now=at(75))  # 0..10 have left the window

    assert ages == pytest.approx([0, 30, 35, 45, 55])
    with session_factory() as session:
        stored = session.scalar(select(func.count()).select_from(AuthFailure))
    assert stored == 5, "rows out of the window must be deleted, not kept forever"


def test_a_write_deletes_every_address_s_rows_that_left_the_window(
    session_factory: sessionmaker[Session],
) -> None:
    """An attacker rotating addresses leaves no more than one window of rows behind."""
    with session_factory.begin() as session:
        for n, address in enumerate(["x1", "x2", "x3"]):
            record_failure(session, address, 60, keep=5, now=at(n))
        record_failure(session, "a", 60, keep=5, now=at(90))

    with session_factory() as session:
        left = set(session.scalars(select(AuthFailure.address)))
    assert left == {"a"}
