"""What a prefork pool's child inherits from the worker that forks it: no lock held by the
lease reaper's pass in progress (a child forked mid-pass hung on its first database call),
and the worker's shutdown request, which the child sees once the parent sets it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from services.settings import Settings
from services.worker import reaper as reaper_module
from services.worker import shutdown
from services.worker.reaper import LeaseReaper

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

    def slow_pass(_settings: Any) -> list[str]:
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
