"""AuthFailureLimiter: a sliding window of failed token checks per client address."""

from __future__ import annotations

import pytest

from services.api import auth_failures
from services.api.auth_failures import AuthFailureLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_blocks_at_the_limit_until_the_oldest_failure_leaves_the_window() -> None:
    clock = Clock()
    limiter = AuthFailureLimiter(3, 60.0, clock)
    for _ in range(2):
        limiter.record_failure("a")
        clock.now += 10
    assert limiter.retry_after("a") is None  # 2 failures: below the limit

    limiter.record_failure("a")  # failures at 1000, 1010, 1020

    assert limiter.retry_after("a") == 40  # the one at 1000 leaves at 1060
    clock.now = 1059.5
    assert limiter.retry_after("a") == 1
    clock.now = 1060.0
    assert limiter.retry_after("a") is None
    limiter.record_failure("a")  # 1010, 1020, 1060: blocked again until 1070
    assert limiter.retry_after("a") == 10


def test_addresses_are_counted_apart() -> None:
    limiter = AuthFailureLimiter(1, 60.0, Clock())
    limiter.record_failure("a")
    assert limiter.retry_after("a") == 60
    assert limiter.retry_after("b") is None


def test_memory_is_bounded_by_forgetting_the_least_recent_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth_failures, "MAX_KEYS", 3)
    limiter = AuthFailureLimiter(1, 60.0, Clock())
    for address in "abcd":
        limiter.record_failure(address)
    assert [limiter.retry_after(a) for a in "abcd"] == [None, 60, 60, 60]


def test_nonsense_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="limit >= 1"):
        AuthFailureLimiter(0, 60.0)


def test_failures_seen_by_other_processes_count_here() -> None:
    """`shared` returns every process's failures: this process adopts them."""
    clock = Clock()
    others = [5.0, 12.0]  # ages of two failures another API process recorded
    limiter = AuthFailureLimiter(3, 60.0, clock, shared=lambda address: [0.0, *others])

    limiter.record_failure("a")  # the third in all: blocked here at once

    assert limiter.retry_after("a") == 48  # the oldest, 12 s old, leaves in 48 s


def test_a_shared_log_that_fails_leaves_the_count_to_this_process() -> None:
    def unreachable(address: str) -> list[float]:
        raise ConnectionError("database down")

    limiter = AuthFailureLimiter(2, 60.0, Clock(), shared=unreachable)
    limiter.record_failure("a")
    assert limiter.retry_after("a") is None
    limiter.record_failure("a")
    assert limiter.retry_after("a") == 60


def test_a_stale_shared_view_does_not_undo_a_fuller_one() -> None:
    """Two failures of one process race: the later-recorded one may answer with an older,
    shorter view of the shared log; the count must not go down."""
    views = iter([[0.0, 1.0], [0.0]])  # the second answer missed the first failure
    limiter = AuthFailureLimiter(3, 60.0, Clock(), shared=lambda address: next(views))

    limiter.record_failure("a")
    limiter.record_failure("a")

    assert limiter.retry_after("a") == 59  # 3 counted (the oldest 1 s old): blocked
