"""Skip a test whose real service or privilege is missing, or fail it under
ACCUM_REQUIRE_SERVICES=1 (as CI sets). A plain module: ``from conftest import ...`` would get
whichever test directory's conftest was imported last."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def services_required() -> bool:
    return os.environ.get("ACCUM_REQUIRE_SERVICES", "") not in ("", "0", "false", "no")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it under ACCUM_REQUIRE_SERVICES=1."""
    if services_required():
        pytest.fail(f"ACCUM_REQUIRE_SERVICES=1 but {reason}")
    pytest.skip(reason)
