"""The heartbeat turns lease renewals into the cheap flags that the trainer polls."""

from __future__ import annotations

import time

from services.worker.heartbeat import Heartbeat


def test_cancelling_status_sets_the_cancel_flag_without_losing_the_lease() -> None:
    statuses = iter(["running", "cancelling"])
    beat = Heartbeat(lambda: next(statuses), interval_s=60, lease_timeout_s=120)
    beat.beat()
    assert not beat.should_stop()
    beat.beat()
    assert beat.cancel_requested and not beat.lease_lost and beat.should_stop()


def test_a_lost_lease_stops_the_job() -> None:
    beat = Heartbeat(lambda: None, interval_s=60, lease_timeout_s=120)
    beat.beat()
    assert beat.lease_lost and beat.should_stop()


def test_failed_renewals_stop_the_job_only_after_the_lease_timeout() -> None:
    def broken() -> str | None:
        raise ConnectionError("database unreachable")

    beat = Heartbeat(broken, interval_s=60, lease_timeout_s=0.2)
    beat.beat()
    assert not beat.should_stop()  # one blip: keep training, the lease has slack
    time.sleep(0.25)
    beat.beat()
    assert beat.lease_lost


def test_the_thread_renews_periodically_until_stopped() -> None:
    calls: list[float] = []

    def renew() -> str:
        calls.append(time.monotonic())
        return "running"

    with Heartbeat(renew, interval_s=0.02, lease_timeout_s=1):
        time.sleep(0.2)
    count = len(calls)
    assert count >= 3
    time.sleep(0.06)
    assert len(calls) == count  # stopped
