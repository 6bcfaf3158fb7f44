"""Per-client-address limit on failed token checks (a sliding window, in this process).

    limiter = AuthFailureLimiter(settings.auth_failures_per_window, settings.auth_failure_window_s)
    limiter.retry_after(address)      # seconds the address must wait, or None
    limiter.record_failure(address)   # after a 401 for a bad token

Once an address has `limit` failures within `window_s`, every request of that address that
needs a token gets 429 with Retry-After until the oldest of those failures leaves the window,
valid token or not: a limit that refused only the failures would still tell a guesser which
guess was right (a 200 among 429s). Other addresses are not affected. The state lives in one
API process: with N uvicorn workers an address gets up to N x `limit` failures per window.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

MAX_ADDRESSES = 100_000  # memory bound: the least recently failing addresses are forgotten


class AuthFailureLimiter:
    """Failure timestamps per client address; thread-safe (routes run in a thread pool)."""

    def __init__(
        self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError(f"need limit >= 1 and window_s > 0, got {limit} and {window_s}")
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, address: str, now: float) -> deque[float] | None:
        failures = self._failures.get(address)
        if failures is None:
            return None
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        if not failures:
            del self._failures[address]
            return None
        return failures

    def retry_after(self, address: str) -> int | None:
        """Whole seconds until `address` may try again, or None if it is not blocked."""
        if address not in self._failures:  # the common case: no lock, no clock
            return None
        with self._lock:
            now = self._clock()
            failures = self._recent(address, now)
            if failures is None or len(failures) < self.limit:
                return None
            # At most `limit` are kept: free again once the oldest leaves the window.
            return max(1, math.ceil(failures[0] + self.window_s - now))

    def record_failure(self, address: str) -> None:
        with self._lock:
            now = self._clock()
            failures = self._recent(address, now) or deque()
            failures.append(now)
            while len(failures) > self.limit:  # older ones no longer decide anything
                failures.popleft()
            self._failures[address] = failures
            self._failures.move_to_end(address)
            while len(self._failures) > MAX_ADDRESSES:
                self._failures.popitem(last=False)
