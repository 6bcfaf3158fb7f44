"""What a prefork pool's child inherits from the worker that forks it: no lock held by the
lease reaper's pass in progress (a child forked mid-pass hung on its first database call),
and the worker's shutdown request, which the child sees once the parent sets it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from services.housekeeping import reaper as reaper_module
from services.housekeeping.reaper import LeaseReaper
from services.settings import Settings
from services.worker import shutdown

PASS_S = 0.3  # how long the fake pass holds its lock: the fork lands well inside it


def exit_code_of_child(body: Callable[[], bool], then: Callable[[], None] = lambda: None) -> int:
    """Fork; the child exits 0 if ``body()`` is true, 1 otherwise, while the parent calls
    ``then()``; returns the child's exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, which leaves with os._exit
        os._exit(0 if body() else 1)
    then()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_fork_waits_for_the_reapers_pass_and_the_child_inherits_no_held_lock(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = threading.Lock()  # stands for any lock a pass takes (a cache's, a pool's)
    in_pass = threading.Event()

    def slow_pass(_settings: Any, _clock: Any, _queues: Any = None) -> list[str]:
        with held:
            in_pass.set()
            time.sleep(PASS_S)
        return []

    monkeypatch.setattr(reaper_module, "reap_once", slow_pass)
    reaper = LeaseReaper(settings, interval_s=0.01).start()
    try:
        assert in_pass.wait(5), "the reaper never started a pass"
        code = exit_code_of_child(lambda: held.acquire(timeout=1))
    finally:
        reaper.stop()
    assert code == 0, "the child was forked mid-pass: it inherited the pass's lock, held for good"


def test_a_forked_child_sees_the_shutdown_requested_after_the_fork() -> None:
    def request_is_seen() -> bool:
        deadline = time.monotonic() + 5
        while not shutdown.requested.is_set():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    shutdown.reset()
    try:
        # The parent's request is what Celery's worker_shutting_down does on SIGTERM.
        code = exit_code_of_child(request_is_seen, then=shutdown.request)
    finally:
        shutdown.reset()
    assert code == 0, "the child never saw the shutdown its parent requested"


class Signal:
    """Stands for one of Celery's signals: records its receivers."""

    def __init__(self) -> None:
        self.receivers: list[Callable[..., Any]] = []

    def connect(self, receiver: Callable[..., Any], weak: bool = True) -> None:
        self.receivers.append(receiver)

    def send(self) -> None:
        for receiver in self.receivers:
            receiver()


class CelerySignals:
    def __init__(self) -> None:
        self.worker_shutting_down, self.worker_process_init = Signal(), Signal()


def test_sigterm_to_a_pool_child_running_a_job_asks_that_job_alone_to_stop() -> None:
    celery_signals = CelerySignals()
    shutdown.connect(celery_signals)

    def child_job_sees_its_own_sigterm() -> bool:
        celery_signals.worker_process_init.send()  # what a prefork pool does in each child
        with shutdown.stop_job_on_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)  # the child lives on: handled, not fatal
            time.sleep(0.01)
            stopped = shutdown.requested.is_set()
        # Only this process: the worker and its next children share nothing of it.
        return stopped and not shutdown.requested.shared.is_set()

    try:
        assert exit_code_of_child(child_job_sees_its_own_sigterm) == 0
        assert not shutdown.requested.is_set(), "the child's SIGTERM reached the worker's flag"
    finally:
        shutdown.reset()


def test_in_the_workers_own_process_sigterm_keeps_celerys_handler() -> None:
    """The solo pool sends worker_process_init in the worker itself: its SIGTERM must stay
    Celery's warm shutdown (which then sets the shared request), not become a job-only stop."""
    celery_signals = CelerySignals()
    shutdown.connect(celery_signals)
    celery_signals.worker_process_init.send()
    before = signal.getsignal(signal.SIGTERM)
    try:
        with shutdown.stop_job_on_sigterm():
            assert signal.getsignal(signal.SIGTERM) is before
    finally:
        shutdown.reset()
    assert shutdown.in_pool_child is False
