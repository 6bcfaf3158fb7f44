"""Retry a worker's write through a short outage: of the database (a PostgreSQL restart, a
failover) or, given ``transient``, of the artifact store (``checkpoints.uploads``).

    retry_while_unreachable(lambda: write(...), what="checkpoint row of job abc", for_s=60)

By default only "cannot reach the database" errors are retried (``database_unreachable``); anything
else, a constraint violation or a bad value, is raised at once: retrying would fail the same
way. A job whose lease cannot be renewed for a whole lease timeout belongs to somebody else
by then, so callers retry for at most that long (or until ``give_up()`` says so).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from services.jobdb.db import database_unreachable, first_line

log = logging.getLogger(__name__)

T = TypeVar("T")
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 1.0


def retry_while_unreachable(
    write: Callable[[], T],
    *,
    what: str,
    for_s: float,
    give_up: Callable[[], bool] = lambda: False,
    transient: Callable[[BaseException], bool] = database_unreachable,
) -> T:
    """``write()``, retried with a growing pause (0.1 s up to 1 s) while the database is
    unreachable (or ``transient(error)``: the artifact store's outages), for at most ``for_s``
    seconds; then, or when ``give_up()``, the last error is raised. ``write`` must be safe to
    run again (its transaction rolled back)."""
    deadline = time.monotonic() + for_s
    delay = FIRST_DELAY_S
    failures = 0
    while True:
        try:
            result = write()
        except Exception as exc:
            if not transient(exc) or give_up() or time.monotonic() + delay > deadline:
                raise
            failures += 1
            if failures == 1:
                log.warning("%s: unreachable (%s); retrying for up to %.0fs", what,
                            first_line(exc), for_s)
            time.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)
            continue
        if failures:
            log.warning("%s: written after %d failed tries", what, failures)
        return result
