"""The lease heartbeat: a thread that renews the job's lease and learns of cancel requests.

The trainer polls ``should_stop()`` before every micro-batch; that must cost nothing, so it
reads two booleans that this thread refreshes every ``interval_s`` from the value the lease
renewal returns (the job's status), and the worker's shutdown flag. There is no database query
per micro-batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from services.jobdb.status import JobStatus

log = logging.getLogger(__name__)


class Flag(Protocol):
    """What the heartbeat reads the shutdown request from (``threading.Event``, or
    ``services.worker.shutdown.ShutdownRequest``, which a prefork pool's child shares)."""

    def is_set(self) -> bool: ...


class Heartbeat:
    """Renews a lease every ``interval_s`` seconds until stopped.

    Args:
        renew: renews the lease; returns the job's status while this worker still holds the
            lease, or None when it does not (the lease expired and was taken away).
        interval_s: seconds between renewals (``ACCUM_HEARTBEAT_INTERVAL_S``).
        lease_timeout_s: if renewals keep failing (database unreachable) for this long, the
            lease has surely expired: stop, since another worker may now own the job.
        shutdown: set when the worker process is shutting down (``services.worker.shutdown``):
            stop too, so the job can be checkpointed and handed back.
        clock: seconds, for the time since the last good renewal (tests pass a fake one).
    """

    def __init__(
        self,
        renew: Callable[[], str | None],
        interval_s: float,
        lease_timeout_s: float,
        shutdown: Flag | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._renew = renew
        self._interval_s = interval_s
        self.lease_timeout_s = lease_timeout_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accum-heartbeat", daemon=True)
        self._last_ok = clock()
        self.cancel_requested = False
        self.lease_lost = False
        self.timed_out = False
        self._deadline: float | None = None
        self._shutdown: Flag = shutdown or threading.Event()

    def start(self) -> Heartbeat:
        self._last_ok = self._clock()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def shutting_down(self) -> bool:
        return self._shutdown.is_set()

    def set_timeout(self, seconds: float | None) -> None:
        """Stop the job (``timed_out``) once it has run ``seconds`` from now (the job's
        ``timeout``), checked at every beat."""
        self._deadline = None if seconds is None else time.monotonic() + seconds

    def should_stop(self) -> bool:
        return self.cancel_requested or self.lease_lost or self.timed_out or self._shutdown.is_set()

    def beat(self) -> None:
        """Renew once now (also called by the thread)."""
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self.timed_out = True
        try:
            status = self._renew()
        except Exception:  # a database blip must not kill the job; the lease has slack
            log.warning("lease renewal failed; retrying in %.1fs", self._interval_s, exc_info=True)
            if self._clock() - self._last_ok > self.lease_timeout_s:
                log.error("lease not renewed for %.0fs: stopping the job", self.lease_timeout_s)
                self.lease_lost = True
            return
        self._last_ok = self._clock()
        if status is None:
            log.error("lease lost: another worker owns the job now; stopping")
            self.lease_lost = True
        elif status == JobStatus.CANCELLING:
            self.cancel_requested = True

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self.beat()
            if self.lease_lost:
                return
