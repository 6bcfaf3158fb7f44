"""What a spawned rank and the worker that supervises it share: the stop the worker raises
(and why), and the rank's progress beats, which tell a rank that trains from one that hung.

    pulse = Pulse.of(spawn_context, k, deadline_s(settings, spec), margin_s(settings))  # the supervisor
    link = RankLink(pulse, stop, local_rank)                                # in rank r's callbacks
    pulse.stale(alive)                                                      # silent ranks

A rank beats from its step loop (``RankLink``: every ``should_stop`` poll, once per window
on k ranks and per micro-batch on one, and every step, evaluation batch (``BeatingLoader``)
and checkpoint), into
shared memory: a monotonic time (``CLOCK_MONOTONIC``, one clock for every process of the
machine) and a count; no system call, no lock. Its supervisor (``distributed.watch_ranks``,
the same code on a gang's leader and its followers) reads them each poll: a rank whose
last beat is older than its deadline made no progress and is ``hung``.

The deadline comes from ``ACCUM_COLLECTIVE_TIMEOUT_S``: ranks meet in a collective every
window, so a peer of a stopped rank fails its collective that long after it entered it; a
stopped rank itself (SIGSTOP, a deadlock outside a collective, a GPU that stopped answering)
fails nothing, and its supervisor is the only one to notice. The deadline is the collective
timeout plus a margin, so that its peers, silent too since their last beat but blocked in a
collective, fail first (of a lost peer) and the rank named is the one that stopped: the margin
is ``MARGIN_S`` (at most half the timeout), or ``GAP_FACTOR`` x the rank's longest gap between
beats where its windows are slower (a peer enters the collective up to a window after its
beat). Within the timeout + ``MARGIN_S`` for short windows: issue 40's bound is the timeout + 10 s.
A rank is watched from its second beat (its first window may compile, and its exactness check
runs twice: no bound) until its ``fit`` returns (``on_fit_end``: the final writes and the
teardown have timeouts of their own).

A world of 1 trains in the worker's own process (``services.worker.launch``: a spawned rank
costs each job its start), as rank 0 in a thread of its own that beats the same way
(``run_here``); the thread that started it watches it by the same rule (``Pulse.stale``) and
names it the same way (``Node.hung``). A hung thread cannot be ended: its supervisor raises
``RankHung`` for the attempt to be recorded ``hung`` and the job resumed (``runner.run_job``),
fences the thread (its next beat raises ``Abandoned``, before any callback writes) and marks the
process ``shutdown.abandoned``: it takes no other job and exits once this one is recorded
(``services.worker.start``: a prefork child ends after its job, a solo worker exits with
``shutdown.EXIT_ABANDONED`` for its supervisor to start it again).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeVar

from accumcore import Callback
from services.settings import Settings
from services.spec import JobSpec
from services.worker import shutdown
from services.worker.attempt import RankHung

MARGIN_S = 5.0  # past ACCUM_COLLECTIVE_TIMEOUT_S (at most half of it): its blocked peers fail first
GAP_FACTOR = 1.5  # x a rank's longest gap between beats seen so far, where that is the longer margin
ARMED_AT = 2  # beats before a rank is watched: its first window has no bound
QUIET = -1  # beats: the rank left its step loop (fit returned), no longer watched
POLL_S = 0.1  # how often ``run_here`` looks at its thread's beats

log = logging.getLogger(__name__)
T = TypeVar("T")

# stop.value: why the supervisor stopped the ranks (0: it did not); the writer ends the job's
# tracker runs by it (``rank.Writer.close``).
CANCEL, TIMEOUT, SHUTDOWN = 1, 2, 3


def deadline_s(settings: Settings, spec: JobSpec) -> float:
    """The silence before the margin that ends an attempt as hung: the collective timeout; a
    sharded (FSDP) job's checkpoint also waits for every rank's upload (a store outage for two
    lease timeouts: ``rank.Writer.open``'s side gather), without a beat."""
    base = settings.collective_timeout_s
    return base + 2 * settings.lease_timeout_s if spec.strategy == "fsdp" else base


def margin_s(settings: Settings) -> float:
    return min(MARGIN_S, settings.collective_timeout_s / 2)


def stop_reason(flags: Any) -> int:
    """The stop's value for the supervisor's flags (a heartbeat, a follower's): a cancel first,
    as ``attempt.outcome`` reads them."""
    if flags.cancel_requested:
        return CANCEL
    if flags.timed_out:
        return TIMEOUT
    if flags.shutting_down:
        return SHUTDOWN
    return CANCEL


@dataclass(frozen=True)
class Silent:
    """A rank past its deadline: its index on this node, its silence and the deadline."""

    local_rank: int
    silent_s: float
    deadline_s: float
    beats: int


@dataclass
class Pulse:
    """The ranks' beats in shared memory (``multiprocessing`` arrays, inherited by spawned ranks)."""

    last: Any  # last[r]: the monotonic time of rank r's last beat
    beats: Any  # beats[r]: how many; QUIET once its fit returned
    gap: Any  # gap[r]: its longest gap between two beats since it was armed
    base_s: float
    margin_s: float

    @classmethod
    def of(cls, context: Any, ranks: int, base_s: float, margin_s: float) -> Pulse:
        return cls(context.Array("d", ranks, lock=False), context.Array("q", ranks, lock=False),
                   context.Array("d", ranks, lock=False), base_s, margin_s)

    @classmethod
    def local(cls, ranks: int, base_s: float, margin_s: float) -> Pulse:
        """For ranks that are threads of this process (``run_here``): plain lists."""
        return cls([0.0] * ranks, [0] * ranks, [0.0] * ranks, base_s, margin_s)

    def beat(self, rank: int) -> None:
        now = time.monotonic()
        beats = self.beats[rank]
        if beats == QUIET:
            return
        if beats >= ARMED_AT:
            self.gap[rank] = max(self.gap[rank], now - self.last[rank])
        self.last[rank] = now
        self.beats[rank] = beats + 1

    def quiet(self, rank: int) -> None:
        self.beats[rank] = QUIET

    def stale(self, ranks: list[int], now: float | None = None) -> list[Silent]:
        """Of ``ranks`` (those alive), the watched ones silent past their deadline."""
        now = time.monotonic() if now is None else now
        silent = []
        for rank in ranks:
            beats = self.beats[rank]
            if beats < ARMED_AT:
                continue
            deadline = self.base_s + max(self.margin_s, GAP_FACTOR * self.gap[rank])
            if now - self.last[rank] > deadline:
                silent.append(Silent(rank, now - self.last[rank], deadline, beats))
        return silent

    def behind(self, ranks: list[int], than_s: float) -> list[Silent]:
        """Of ``ranks``, the watched ones silent for longer than ``than_s``: who a peer that
        failed of a lost peer waited for."""
        now = time.monotonic()
        return [Silent(r, now - self.last[r], than_s, self.beats[r]) for r in ranks
                if self.beats[r] >= ARMED_AT and now - self.last[r] > than_s]


class BeatingLoader:
    """The validation loader, each batch a beat: an evaluation has no step of its own, and a
    long one would look like a hang (its length and attributes are the loader's)."""

    def __init__(self, loader: Any, link: RankLink) -> None:
        self.loader, self.link = loader, link

    def __iter__(self) -> Any:
        for batch in self.loader:
            self.link.beat()
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class RankLink(Callback):
    """A rank's side: beats from its step loop, and the stop its supervisor raises (a cancel,
    a timeout or a shutdown; read as ``attempt.Flags`` for how its trackers end). In the
    worker's process (``run_here``) the stop is never raised (``NO_STOP``: the heartbeat's
    flags stop it), and ``fenced`` once its supervisor gave up on it as hung."""

    fenced = False

    def __init__(self, pulse: Pulse, stop: Any, local_rank: int) -> None:
        self.pulse, self.stop, self.local_rank = pulse, stop, local_rank

    def beat(self) -> None:
        if self.fenced:  # first among the rank's callbacks: nothing after it writes
            raise Abandoned(f"rank {self.local_rank} was ended as hung by its supervisor; its "
                            "attempt is recorded and the job resumes elsewhere")
        self.pulse.beat(self.local_rank)

    def should_stop(self) -> bool:
        self.beat()
        return bool(self.stop.value)

    def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        self.beat()

    def on_eval(self, trainer: Any, metrics: dict[str, float]) -> None:
        self.beat()

    def on_checkpoint(self, trainer: Any, info: Any) -> None:
        self.beat()

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        self.pulse.quiet(self.local_rank)

    # attempt.Flags: the supervisor's reason for the stop (its lease is its own business).
    lease_lost = False

    @property
    def cancel_requested(self) -> bool:
        return self.stop.value == CANCEL

    @property
    def timed_out(self) -> bool:
        return self.stop.value == TIMEOUT

    @property
    def shutting_down(self) -> bool:
        return self.stop.value == SHUTDOWN


NO_STOP = SimpleNamespace(value=0)  # the stop of a rank in the worker's process: never raised


class Abandoned(BaseException):
    """Raised at the next beat of a training thread its supervisor ended as hung, should it
    ever wake: a ``BaseException``, so no ``except Exception`` of the training swallows it."""


@dataclass(frozen=True)
class Node:
    """Where this node's ranks are, for what the supervisor says of them: node ``index`` of
    ``nodes``, its first global rank, and the collective timeout its ranks run under."""

    index: int
    nodes: int
    first_rank: int
    collective_timeout_s: float

    def hung(self, silent: list[Silent], pids: list[int | None], after: str) -> RankHung:
        names = ", ".join(
            f"rank {self.first_rank + s.local_rank} (pid {pids[s.local_rank]}, "
            f"{s.beats} beats) made no progress for {s.silent_s:.1f} s" for s in silent)
        return RankHung(
            f"node {self.index} of {self.nodes}: {names} ({after}; ACCUM_COLLECTIVE_TIMEOUT_S="
            f"{self.collective_timeout_s:g} s): hung; ended with every rank of the attempt")


def run_here(train: Callable[[RankLink], T], settings: Settings, spec: JobSpec) -> T:
    """Run ``train`` (a world of 1: rank 0 of node 0, in this process) in a thread, watched as
    ``distributed.watch_ranks`` watches spawned ranks: its return, or what it raised; or
    ``RankHung`` once its beats (``train``'s link) stop past the same deadline. The hung thread
    is left behind, fenced, and this process marked ``shutdown.abandoned``."""
    pulse = Pulse.local(1, deadline_s(settings, spec), margin_s(settings))
    link = RankLink(pulse, NO_STOP, 0)
    done: list[T] = []
    failed: list[BaseException] = []

    def rank_0() -> None:
        try:
            done.append(train(link))
        except BaseException as exc:  # re-raised in the supervisor's thread, its traceback kept
            failed.append(exc)

    thread = threading.Thread(target=rank_0, name="accum-rank-0", daemon=True)
    thread.start()
    while True:
        thread.join(POLL_S)
        if not thread.is_alive():
            break
        silent = pulse.stale([0])
        if silent:
            link.fenced = True
            shutdown.abandoned.set()
            node = Node(0, 1, 0, settings.collective_timeout_s)
            error = node.hung(silent, [os.getpid()], f"past its deadline of {silent[0].deadline_s:.1f} s, "
                              "in the worker's process: its thread is left behind and the process "
                              "exits once the attempt is recorded")
            log.warning("%s", error)
            raise error
    if failed:
        raise failed[0]
    return done[0]
