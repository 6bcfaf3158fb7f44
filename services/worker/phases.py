"""Where an attempt's time goes, timed by the worker that runs it (``job_attempts.phases``).

    phases.begin()                 # the runner, as the job's message arrives
    phases.mark("claim")           # each phase's end, where it ends (the first mark of a name counts)
    phases.taken()                 # {"claim": 0.012, "admit": 0.004, "build": 0.21, ...} seconds

The phases, in order: ``claim`` (the claim's transaction), ``admit`` (the spec parsed and
checked again), ``build`` (the node made ready to resume, the store and trackers opened, data
and model built), ``checks`` (to the end of the first-window exactness check), ``train`` (to
the end of ``fit``: the steps, evaluations, the trainer's checkpoints), ``final_writes`` (the
last checkpoint's upload awaited, the last metrics written), ``tracker_end`` (the trackers'
runs ended) and ``finish`` (the outcome's transaction, to its commit). A phase not marked
(no check ran; no trackers) adds its time to the next one marked: a ``gpus: k`` or ``nodes``
job, whose ranks build and train in processes of their own, shows claim, admit, train, finish. One attempt at a time per process: the state is this module's; marks in
a process that did not ``begin`` (a spawned rank) are ignored.
"""

from __future__ import annotations

import time

PHASES = ("claim", "admit", "build", "checks", "train", "final_writes", "tracker_end", "finish")

_marks: dict[str, float] | None = None
_start = 0.0


def begin() -> None:
    """A new attempt's clock, from now (the previous attempt's marks are dropped)."""
    global _marks, _start
    _marks, _start = {}, time.perf_counter()


def mark(name: str) -> None:
    """``name`` ended now (its first mark counts: a pending check that runs again, the store
    closed twice)."""
    if _marks is not None and name not in _marks:
        _marks[name] = time.perf_counter()


def taken() -> dict[str, float]:
    """Seconds per phase marked, in the order they ended, rounded to the millisecond."""
    if _marks is None:
        return {}
    out: dict[str, float] = {}
    previous = _start
    for name, at in sorted(_marks.items(), key=lambda item: item[1]):
        out[name] = round(max(at - previous, 0.0), 3)
        previous = at
    return out


def end() -> None:
    """No attempt timed any more (marks are ignored until the next ``begin``)."""
    global _marks
    _marks = None
