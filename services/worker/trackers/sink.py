"""Delivers one job's points to one tracker from a thread of its own, in batches.

The training thread only appends to a list (``push``); every ``flush_every_s`` the sink's
thread sends what accumulated in one call per tracker, so logging costs the trainer a list
append per step (bench/trainer/tracker_overhead.py). A tracker that cannot be reached never
fails the job: the points stay buffered, an event ``tracker_undelivered`` says what waits,
the sink tries again each period, and an event ``tracker_delivered`` says when it caught up.
When the job ends with the tracker still down, the thread outlives the attempt and delivers
once the tracker is back (as long as this worker process lives; the points are in accum's
store, and a later attempt of the job sends what its tracker run lacks).

Exactly once per step: ``tracker_runs.delivered_step`` is the last step the tracker has (or
the tracker's own account, where it keeps one: MLflow's server, W&B's run files); a resumed
attempt sends the steps after it, first those of earlier attempts (read back from the metrics
store), then its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from services.store.events import add_event
from services.store.metrics import read_metrics
from services.store.tracker_runs import mark_delivered, mark_undelivered, open_run, set_identity
from services.worker.trackers.base import FinalCheckpoint, RunIdentity, StepPoints, Tracker

log = logging.getLogger(__name__)
BACKLOG_PAGE = 10_000


class TrackerSink:
    def __init__(self, tracker: Tracker, sessions: sessionmaker[Session], identity: RunIdentity,
                 attempt: int, flush_every_s: float) -> None:
        self.tracker, self.sessions, self.identity = tracker, sessions, identity
        self.attempt, self.flush_every_s = attempt, flush_every_s
        self._points: list[StepPoints] = []
        self._tags: dict[str, str] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._ending: tuple[str, FinalCheckpoint | None] | None = None
        self._thread: threading.Thread | None = None
        self.opened = False
        self.delivered_step = identity.delivered_step
        self._outage: str | None = None  # the error of the outage in progress
        self.done = threading.Event()  # everything delivered and the run finished or released

    # ------------------------------------------------------------- the training thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"accum-{self.tracker.name}",
                                        daemon=True)
        self._thread.start()

    def push(self, points: StepPoints) -> None:
        with self._lock:
            self._points.append(points)

    def tag(self, key: str, value: str) -> None:
        with self._lock:
            self._tags[key] = value

    def end(self, status: str | None, checkpoint: FinalCheckpoint | None) -> None:
        """Stop once what is buffered is delivered (status None: the job goes on in a later
        attempt, so the run stays open); ``wait_all`` waits for it."""
        with self._lock:
            self._ending = (status or "", checkpoint)
        self._wake.set()

    # ------------------------------------------------------------------ its own thread
    def _loop(self) -> None:
        while True:
            self._wake.wait(self.flush_every_s)
            self._wake.clear()
            with self._lock:
                ending = self._ending
            if self._deliver() and ending is not None and self._finish(*ending):
                self.done.set()
                return

    def _deliver(self) -> bool:
        """Send what is buffered; False (points kept) when the tracker could not take them."""
        with self._lock:
            points, self._points = self._points, []
            tags, self._tags = self._tags, {}
        try:
            if not self.opened:
                points = self._open() + points
            fresh = merged([p for p in points if p.step > self.delivered_step])
            if fresh or tags:
                self.tracker.send(fresh, tags)
        except Exception as exc:  # any client error: the tracker is down, try again later
            with self._lock:
                self._points[:0] = points
                self._tags = {**tags, **self._tags}
            self._report_outage(exc, len(points))
            return False
        if fresh:
            self.delivered_step = fresh[-1].step
            self._write(lambda s: mark_delivered(s, self.identity.job_id, self.tracker.name,
                                                 self.delivered_step))
        if self._outage is not None:
            self._outage = None
            self._event("tracker_delivered",
                        f"{self.tracker.name} reachable again: every step up to "
                        f"{self.delivered_step} delivered", {"step": self.delivered_step})
        return True

    def _open(self) -> list[StepPoints]:
        """Open the run; returns the earlier attempts' points it lacks, from the store."""
        run_id, url, held = self.tracker.open(self.identity)
        self.opened = True
        # The tracker's own account wins over the row: a killed attempt may have recorded a
        # step whose points never left (W&B's service process dies with it), or sent a batch
        # it did not live to record.
        if held is not None:
            self.delivered_step = held
        self._write(lambda s: set_identity(s, self.identity.job_id, self.tracker.name, run_id, url))
        return self._backlog()

    def _backlog(self) -> list[StepPoints]:
        by_step: dict[int, StepPoints] = {}
        with self.sessions() as session:
            cursor: str | None = None
            while True:
                rows, cursor = read_metrics(session, self.identity.job_id,
                                            since_step=self.delivered_step, limit=BACKLOG_PAGE,
                                            cursor=cursor)
                for row in rows:
                    if row.value is not None:
                        by_step.setdefault(row.step, StepPoints(row.step)).values[row.name] = row.value
                if cursor is None:
                    break
        # Later steps are this attempt's own, pushed live.
        return [by_step[step] for step in sorted(by_step) if step <= self.identity.resume_step]

    def _finish(self, status: str, checkpoint: FinalCheckpoint | None) -> bool:
        try:
            if status:
                self.tracker.finish(status, checkpoint)
            self.tracker.close()
        except Exception as exc:
            self._report_outage(exc, 0)
            return False
        return True

    def _report_outage(self, exc: Exception, waiting: int) -> None:
        error = f"{type(exc).__name__}: {exc}"[:500]
        log.warning("job %s: %s not delivered (%s); retrying", self.identity.job_id,
                    self.tracker.name, error)
        if self._outage is not None:
            return
        self._outage = error
        self._write(lambda s: mark_undelivered(s, self.identity.job_id, self.tracker.name, error))
        # The message names the client's error type only: its text may hold the server's address.
        since = (f"steps after {self.delivered_step}" if self.delivered_step >= 0
                 else "the job's parameters and steps")
        self._event("tracker_undelivered",
                    f"{self.tracker.name} unreachable ({type(exc).__name__}): {since} not "
                    "delivered yet; the job goes on and they are sent when it is back (a "
                    "missing client: install accum[trackers] on the worker)",
                    {"step": self.delivered_step, "waiting_steps": waiting})

    def _event(self, kind: str, message: str, data: dict[str, object]) -> None:
        def write(session: Session) -> None:
            add_event(session, self.identity.job_id, kind, message,
                      {"tracker": self.tracker.name, **data}, attempt=self.attempt)

        self._write(write)

    def _write(self, write: Callable[[Session], None]) -> None:
        """One transaction; a database error is logged, never raised into delivery (the
        tracker's own state is what counts; the row catches up on the next write)."""
        try:
            with self.sessions.begin() as session:
                write(session)
        except Exception:
            log.warning("job %s: recording %s delivery failed", self.identity.job_id,
                        self.tracker.name, exc_info=True)


def merged(points: list[StepPoints]) -> list[StepPoints]:
    """One entry per step, ascending: a step the store's backlog and this attempt both have
    (the exactness check's step 0) is sent once."""
    by_step: dict[int, StepPoints] = {}
    for p in points:
        if p.step in by_step:
            by_step[p.step] = StepPoints(p.step, {**by_step[p.step].values, **p.values})
        else:
            by_step[p.step] = p
    return [by_step[step] for step in sorted(by_step)]


def ensure_row(sessions: sessionmaker[Session], job_id: str, tracker: str) -> tuple[str | None, int]:
    """The job's run in ``tracker`` as stored (its id, the last step delivered), the row
    created when the job has none yet."""
    with sessions.begin() as session:
        run = open_run(session, job_id, tracker)
        return run.run_id, run.delivered_step


def wait_all(sinks: list[TrackerSink], wait_s: float) -> None:
    """Wait up to ``wait_s`` for every sink to deliver what it has; a sink whose tracker is
    still down goes on delivering on its own thread once it is back."""
    deadline = time.monotonic() + wait_s
    for sink in sinks:
        if not sink.done.wait(max(0.0, deadline - time.monotonic())):
            log.warning("job %s: %s has not taken every point by the end of the attempt; "
                        "this worker goes on delivering them", sink.identity.job_id,
                        sink.tracker.name)
