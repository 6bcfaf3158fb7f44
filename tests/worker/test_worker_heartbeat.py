"""The heartbeat turns lease renewals into the cheap flags that the trainer polls (a fake
clock stands for the time between renewals: no test sleeps)."""

from __future__ import annotations

import threading

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

    now = [100.0]
    beat = Heartbeat(broken, interval_s=60, lease_timeout_s=120, clock=lambda: now[0])
    beat.beat()
    assert not beat.should_stop()  # one blip: keep training, the lease has slack
    now[0] += 120
    beat.beat()
    assert not beat.should_stop()  # failing for exactly the lease timeout: not yet
    now[0] += 1
    beat.beat()
    assert beat.lease_lost and beat.should_stop()


def test_a_good_renewal_restarts_the_timeout() -> None:
    results: list[str | Exception] = [ConnectionError("blip"), "running", ConnectionError("blip")]

    def renew() -> str | None:
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    now = [0.0]
    beat = Heartbeat(renew, interval_s=60, lease_timeout_s=10, clock=lambda: now[0])
    beat.beat()
    now[0] = 9.0
    beat.beat()  # renewed at 9
    now[0] = 18.0
    beat.beat()  # failing for 9 s since the last good renewal, not 18
    assert not beat.lease_lost


def test_the_thread_renews_periodically_until_stopped() -> None:
    calls: list[int] = []
    three = threading.Event()

    def renew() -> str:
        calls.append(1)
        if len(calls) == 3:
            three.set()
        return "running"

    beat = Heartbeat(renew, interval_s=0.01, lease_timeout_s=1)
    with beat:
        assert three.wait(timeout=30), "the thread did not renew three times"
    assert not beat._thread.is_alive()  # stop() joined it: no renewal after the job
    assert not beat.should_stop()
