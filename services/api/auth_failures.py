"""Limit on failed token checks per key (a sliding window over every API process).

    limiter = AuthFailureLimiter(settings.auth_failures_per_window, settings.auth_failure_window_s,
                                 shared=shared_failure_log(session_factory, limit, window_s))
    limiter.retry_after(key)      # seconds the key must wait, or None (from memory)
    limiter.record_failure(key)   # after a 401 for a bad token (blocking: a worker thread)

Keys are `address:<client address>` and `token:<the presented token's 12-character prefix>`
(services/api/auth.py). Once a key has `limit` failures within `window_s`, a bad token that
falls under it gets 429 with Retry-After instead of 401 until the oldest of those failures
leaves the window. A valid token is never refused by it: an earlier version blocked every
request of the address, so 22 bad tokens from one address locked out every valid user behind
the same NAT or proxy. The 200 a valid token still gets tells a guesser nothing it could use:
tokens carry 256 random bits, and the limit is on the guessing rate, per address and per
targeted prefix (a changing X-Forwarded-For, or many addresses, do not escape the latter).

Every request is answered from this process's memory. A failure is also written to the
database (`shared`, services/jobdb/auth_failures.py), which answers with the key's failures
from every API process, and this process adopts that view: with N processes (uvicorn workers,
replicas) a key gets at most `limit` + N - 1 failures per window, not N x `limit`
(each process blocks at its own next failure once the total is reached). If the database
cannot be written, the failure is counted in this process only.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from sqlalchemy.orm import Session

from services.jobdb import auth_failures as store_auth_failures
from services.jobdb.db import first_line

log = logging.getLogger(__name__)

MAX_KEYS = 100_000  # memory bound: the least recently failing keys are forgotten


class AuthFailureLimiter:
    """Failure timestamps per key (a client address, a token prefix); thread-safe (routes run in a thread pool)."""

    def __init__(
        self,
        limit: int,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        shared: Callable[[str], list[float]] | None = None,
    ) -> None:
        """``shared(key)`` records a failure where every API process sees it and returns
        the ages in seconds of the key's newest failures (at most ``limit``) from all."""
        if limit < 1 or window_s <= 0:
            raise ValueError(f"need limit >= 1 and window_s > 0, got {limit} and {window_s}")
        self.limit, self.window_s, self._clock, self._shared = limit, window_s, clock, shared
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float] | None:
        failures = self._failures.get(key)
        if failures is None:
            return None
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        if not failures:
            del self._failures[key]
            return None
        return failures

    def retry_after(self, key: str) -> int | None:
        """Whole seconds until `key` may try again, or None if it is not blocked."""
        if key not in self._failures:  # the common case: no lock, no clock
            return None
        with self._lock:
            now = self._clock()
            failures = self._recent(key, now)
            if failures is None or len(failures) < self.limit:
                return None
            # At most `limit` are kept: free again once the oldest leaves the window.
            return max(1, math.ceil(failures[0] + self.window_s - now))

    def record_failure(self, key: str) -> None:
        everywhere = self._record_shared(key)
        with self._lock:
            now = self._clock()
            if everywhere is not None:  # all processes' failures, this one's included
                failures = deque(sorted(now - age for age in everywhere))
                # A concurrent failure of this process may have stored a fuller view first:
                # keep that one, with this failure (counting it twice errs on the safe side).
                known = self._recent(key, now)
                if known is not None and len(known) >= len(failures):
                    failures = known
                    failures.append(now)
            else:
                failures = self._recent(key, now) or deque()
                failures.append(now)
            while len(failures) > self.limit:  # older ones no longer decide anything
                failures.popleft()
            self._failures[key] = failures
            self._failures.move_to_end(key)
            while len(self._failures) > MAX_KEYS:
                self._failures.popitem(last=False)

    def _record_shared(self, key: str) -> list[float] | None:
        if self._shared is None:
            return None
        try:
            return self._shared(key)
        except Exception as exc:  # a database outage must not turn a 401 into an error
            log.warning("failed token check from %s not shared (%s): counted in this process only",
                        key, first_line(exc))
            return None


def shared_failure_log(
    sessions: Callable[[], Session], limit: int, window_s: float
) -> Callable[[str], list[float]]:
    """`AuthFailureLimiter`'s ``shared``: failures recorded in the job store."""

    def record(key: str) -> list[float]:
        with sessions() as session, session.begin():
            return store_auth_failures.record_failure(session, key, window_s, keep=limit)

    return record
