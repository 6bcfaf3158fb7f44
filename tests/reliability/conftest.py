"""Fixtures shared by the reliability tests (faults, bad input, auth, limits, load)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .private_servers import private_postgres, private_redis  # noqa: F401  (fixtures)
from .record import record_figure as _record


@pytest.fixture
def record_figure(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``record_figure(key, area=..., check=..., figure=..., passed=...)`` for this test."""

    def record(key: str, **row: Any) -> None:
        _record(key, test=request.node.nodeid, **row)

    return record
