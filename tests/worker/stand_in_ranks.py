"""Stand-ins for DDP ranks, for the tests of the parent that watches them
(``services.worker.distributed.watch_ranks``). Only the standard library: a spawned child
imports this module and nothing heavier, so it starts in a fraction of a second (a real rank
imports torch). Each takes its rank, the shared ``finished`` and ``exits`` flags, and extras."""

from __future__ import annotations

import os
import time


def finish_then_abort(rank: int, finished, exits) -> None:
    if rank == 1:
        finished[rank] = 1
        os.abort()  # what gloo's teardown did: SIGABRT after the rank's work was done
    time.sleep(1.0)  # rank 0 still writing its final checkpoint
    finished[rank] = 1
    exits[rank] = 1  # reached the end: it was not signalled


def abort_before_finishing(rank: int, finished, exits) -> None:
    if rank == 1:
        os.abort()
    time.sleep(30)  # would train on; the parent must stop it
    exits[rank] = 1


def stop_when_asked(rank: int, finished, exits, stop, stopped: int) -> None:
    deadline = time.monotonic() + 60
    while not stop.value and time.monotonic() < deadline:  # training, window after window
        time.sleep(0.01)
    finished[rank] = stopped  # stopped at a window boundary, its checkpoint recorded
    exits[rank] = 1


def never_stop(rank: int, finished, exits, stop, stopped: int) -> None:
    time.sleep(60)  # stuck in a collective, say
    exits[rank] = 1


def exit_on_an_error(rank: int, finished, exits, said_lost: int) -> None:
    """Rank 1 dies of an exception it raised, having said whether it was its peers' loss (as
    ``services.worker.distributed._rank_main`` does in ``peer_lost``; ``exits`` stands for it)."""
    if rank == 1:
        exits[rank] = said_lost
        os._exit(1)
    time.sleep(30)  # in a collective with rank 1; the parent must stop it


def beat(rank: int, last, beats) -> None:
    """A step loop's beat, as ``services.worker.pulse.Pulse.beat`` writes it (gap left at 0)."""
    last[rank] = time.monotonic()
    beats[rank] += 1


def beat_on(rank: int, finished, exits, last, beats) -> None:
    """Trains (beats every 10 ms) until the parent ends it; it stops one with SIGSTOP."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        beat(rank, last, beats)
        time.sleep(0.01)
    exits[rank] = 1


def fail_waiting_for_a_silent_peer(rank: int, finished, exits, last, beats) -> None:
    """Rank 1 beats 3 times, then is silent (stuck outside any collective); rank 0 beats on for
    a second, then dies of its collective timing out (saying so in ``exits``, its peer_lost)."""
    for _ in range(3):
        beat(rank, last, beats)
        time.sleep(0.01)
    if rank == 1:
        time.sleep(60)
        return
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        beat(rank, last, beats)
        time.sleep(0.01)
    exits[rank] = 1
    os._exit(1)
