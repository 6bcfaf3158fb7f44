"""A world of 1 trains in its worker's process, in a thread that the worker watches by the rule
its spawned ranks are watched by (``services.worker.pulse.run_here``): what the thread returns
or raises comes back; a thread whose beats stop past ACCUM_COLLECTIVE_TIMEOUT_S + the margin is
named hung (``RankHung``, recorded ``hung``), fenced (its next beat raises ``Abandoned``) and
the process is marked to take no other job (``shutdown.abandoned``). The whole job, through a
real worker, is tests/reliability/test_hung_single.py."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.jobdb.leases import HUNG
from services.settings import Settings
from services.spec import parse_spec
from services.worker import shutdown
from services.worker.attempt import RankHung
from services.worker.pulse import Abandoned, RankLink, run_here

SPEC = parse_spec({"model": "mlp", "dataset": "digits", "micro_batch_size": 16, "accumulation_steps": 2,
                   "max_steps": 3, "optimizer": {"name": "sgd", "lr": 0.1}})
TIMEOUT_S = 0.4  # the deadline: 0.4 s + a margin of 0.2 s (half the timeout) after the last beat


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    yield Settings(home=tmp_path, collective_timeout_s=TIMEOUT_S)
    shutdown.abandoned.clear()  # this test process takes "jobs" on


def test_the_thread_s_return_and_its_error_come_back(settings: Settings) -> None:
    def trains(link: RankLink) -> int:
        link.beat()
        link.beat()
        return 7

    assert run_here(trains, settings, SPEC) == 7

    def fails(link: RankLink) -> None:
        link.beat()
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        run_here(fails, settings, SPEC)
    assert not shutdown.abandoned.is_set()


def test_a_thread_that_stops_beating_is_hung_fenced_and_the_process_abandoned(settings: Settings) -> None:
    blocked, woke = threading.Event(), []

    def stuck(link: RankLink) -> None:
        link.beat()
        link.beat()  # armed: watched from its second beat
        blocked.wait(60)  # a dataset that blocks
        try:
            link.beat()
        except Abandoned as exc:
            woke.append(exc)

    started = time.monotonic()
    with pytest.raises(RankHung, match=rf"^node 0 of 1: rank 0 \(pid {os.getpid()}, 2 beats\) made no progress "
                                       r"for [\d.]+ s \(past its deadline of 0\.6 s, in the worker's process"):
        run_here(stuck, settings, SPEC)
    assert time.monotonic() - started < 30  # the deadline is 0.6 s; generous for a loaded machine
    assert shutdown.abandoned.is_set() and RankHung.fault is HUNG and HUNG.kind == "hung"
    blocked.set()  # the thread wakes: its next beat raises, before any callback could write
    deadline = time.monotonic() + 30
    while not woke and time.monotonic() < deadline:
        time.sleep(0.01)
    assert woke and isinstance(woke[0], Abandoned)
