"""Delivers one job's points to one tracker from a thread of its own, in batches.

It runs in the tracker host process (``host``), whose main thread appends the metrics dicts
the training process handed over to a list (``push``). Every ``flush_every_s`` the
sink's thread takes the list, groups it into steps, and sends them in as few calls as the
tracker allows (bench/trainer/tracker_overhead.py). A tracker that cannot be reached never
fails the job: the points stay buffered, an event ``tracker_undelivered`` says what waits,
the sink tries again each period, and an event ``tracker_delivered`` says when it caught up.
When the job ends with the tracker still down, the host (and this thread) outlives the attempt
and delivers once the tracker is back, as long as the worker process lives. Beyond it nothing is lost:
the points are in accum's metrics store, and the job's next attempt, or, for a job that has
ended, none (docs/trackers.md says what then), sends what its tracker run lacks.

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
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from services.jobdb.events import add_event
from services.jobdb.metrics import read_metrics
from services.jobdb.tracker_runs import mark_delivered, mark_undelivered, open_run, set_identity
from services.worker.trackers.base import FinalCheckpoint, RunIdentity, StepPoints, Tracker

log = logging.getLogger(__name__)
BACKLOG_PAGE = 10_000
NUMBER = (float, int)  # not bool: ``type(True) is bool``
SKIP = frozenset({"step", "epoch"})  # the point's coordinates, not metrics


class TrackerSink:
    def __init__(self, tracker: Tracker, sessions: sessionmaker[Session], identity: RunIdentity,
                 attempt: int, flush_every_s: float, max_buffered_steps: int = 100_000) -> None:
        self.tracker, self.sessions, self.identity = tracker, sessions, identity
        self.attempt, self.flush_every_s = attempt, flush_every_s
        self.max_buffered_steps = max_buffered_steps
        self._raw: list[dict[str, Any]] = []  # the training thread's, by reference
        self._waiting: list[StepPoints] = []  # taken by the sink's thread, not delivered yet
        # Buffered steps let go when ``_waiting`` passed its bound (a long outage, a tracker
        # slower than training): the last of them; they are read back from accum's store.
        self._let_go_through = -1
        self._tags: dict[str, str] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._ending: tuple[str, FinalCheckpoint | None] | None = None
        self._thread: threading.Thread | None = None
        self.opened = False
        self.delivered_step = identity.delivered_step
        self._outage: str | None = None  # the error of the outage in progress
        self.done = threading.Event()  # everything delivered and the run finished or released
        # This sink's thread's CPU time so far (bench/trainer/tracker_overhead), and the part
        # of it spent opening and finishing the run (once an attempt, not a step's cost).
        self.cpu_s = self.open_end_cpu_s = 0.0

    # ------------------------------------------------------------- the host's main thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"accum-{self.tracker.name}",
                                        daemon=True)
        self._thread.start()

    def push(self, metrics: dict[str, Any]) -> None:
        """A step's (or an evaluation's) metrics as the trainer gave them, ``step`` included;
        the dict is read later, on the sink's thread, so it must not change after."""
        with self._lock:
            self._raw.append(metrics)

    def tag(self, key: str, value: str) -> None:
        with self._lock:
            self._tags[key] = value

    def flush(self) -> None:
        """Deliver what is buffered now instead of at the next period."""
        self._wake.set()

    def end(self, status: str | None, checkpoint: FinalCheckpoint | None) -> None:
        """Stop once what is buffered is delivered (status None: the job goes on in a later
        attempt, so the run stays open); ``done`` is set then."""
        with self._lock:
            self._ending = (status or "", checkpoint)
        self._wake.set()

    # ------------------------------------------------------------------ its own thread
    def _loop(self) -> None:
        while True:  # the first round opens the run at once: it shows from the job's start
            with self._lock:
                ending = self._ending
            started = time.thread_time()
            finished = (self._deliver(ending is not None) and ending is not None
                        and self._finish(*ending))
            self.cpu_s += time.thread_time() - started
            if finished:
                self.done.set()
                return
            self._wake.wait(self.flush_every_s)
            self._wake.clear()

    def _take(self, ending: bool) -> dict[str, str]:
        """Move the training thread's dicts to ``_waiting`` as steps; the last step stays
        behind (its evaluation may not be in yet) unless the attempt is ending. Returns the
        tags set since the last call."""
        with self._lock:
            raw, self._raw = self._raw, []
            tags, self._tags = self._tags, {}
            if not ending and raw:
                last, cut = raw[-1]["step"], len(raw)
                while cut and raw[cut - 1]["step"] == last:
                    cut -= 1
                self._raw[:0], raw = raw[cut:], raw[:cut]
        self._waiting.extend(steps_of(raw))
        if (over := len(self._waiting) - self.max_buffered_steps) > 0:  # the oldest go
            if self._let_go_through <= self.delivered_step:
                log.warning("job %s: %s buffers over %d steps; the oldest are read back from "
                            "accum's metrics store when it takes them", self.identity.job_id,
                            self.tracker.name, self.max_buffered_steps)
            self._let_go_through = max(self._let_go_through, *(p.step for p in self._waiting[:over]))
            del self._waiting[:over]
        return tags

    def _deliver(self, ending: bool) -> bool:
        """Send what is buffered; False (points kept) when the tracker could not take them."""
        tags = self._take(ending)
        try:
            if not self.opened:
                started = time.thread_time()
                self._waiting[:0] = self._open()
                self.open_end_cpu_s += time.thread_time() - started
            while self._let_go_through > self.delivered_step:  # in bounded pieces
                through = min(self._let_go_through, self.delivered_step + self.max_buffered_steps)
                stored = self._stored(self.delivered_step, through)
                if stored or tags:
                    self.tracker.send(stored, tags)
                    tags = {}
                self._delivered(through)
            fresh = merged([p for p in self._waiting if p.step > self.delivered_step])
            if fresh or tags:
                self.tracker.send(fresh, tags)
        except Exception as exc:  # any client error: the tracker is down, try again later
            with self._lock:
                self._tags = {**tags, **self._tags}
            self._report_outage(exc, len(self._waiting))
            return False
        self._waiting = []
        if fresh:
            self._delivered(fresh[-1].step)
        if self._outage is not None:
            self._outage = None
            self._event("tracker_delivered",
                        f"{self.tracker.name} reachable again: every step up to "
                        f"{self.delivered_step} delivered", {"step": self.delivered_step})
        return True

    def _delivered(self, step: int) -> None:
        self.delivered_step = step
        self._write(lambda s: mark_delivered(s, self.identity.job_id, self.tracker.name, step))

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
        """The earlier attempts' steps the run lacks (later ones are this attempt's own,
        pushed live); more than the buffer's bound are read a bound's worth at a time."""
        if self.identity.resume_step - self.delivered_step > self.max_buffered_steps:
            self._let_go_through = self.identity.resume_step  # read in pieces by ``_deliver``
            return []
        return self._stored(self.delivered_step, self.identity.resume_step)

    def _stored(self, after: int, through: int) -> list[StepPoints]:
        """Steps ``after < step <= through`` as accum's metrics store holds them."""
        by_step: dict[int, StepPoints] = {}
        with self.sessions() as session:
            cursor: str | None = None
            while True:
                rows, cursor = read_metrics(session, self.identity.job_id, since_step=after,
                                            limit=BACKLOG_PAGE, cursor=cursor, until_step=through)
                for row in rows:
                    if row.value is not None:
                        by_step.setdefault(row.step, StepPoints(row.step)).values[row.name] = row.value
                if cursor is None:
                    break
        return [by_step[step] for step in sorted(by_step)]

    def _finish(self, status: str, checkpoint: FinalCheckpoint | None) -> bool:
        started = time.thread_time()
        try:
            if status:
                self.tracker.finish(status, checkpoint)
            self.tracker.close()
        except Exception as exc:
            self._report_outage(exc, 0)
            return False
        finally:
            self.open_end_cpu_s += time.thread_time() - started
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
        cause, fix = outage_cause(exc, self.tracker.name)
        self._event("tracker_undelivered",
                    f"{self.tracker.name} {cause}: {since} not delivered yet; the job goes on "
                    f"and they are sent when it is back ({fix})",
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


# Where each tracker's server is set (the fix a down server's event names).
_SERVER_SETTING = {"mlflow": "ACCUM_MLFLOW_TRACKING_URI", "wandb": "ACCUM_WANDB_BASE_URL"}
_UNREACHABLE_TEXT = ("connection refused", "max retries exceeded", "timed out",
                     "name or service not known", "failed to establish a new connection")


def outage_cause(exc: BaseException, tracker: str) -> tuple[str, str]:
    """(what happened, what to do) for a tracker's error, from its type along the chain of
    causes (MLflow's client raises its own exception from the connection's): a client that is
    not installed, a server that refused or did not answer, or another error of the tracker.
    Neither says the error's text: it may hold the server's address or a token."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    if any(isinstance(e, ImportError) for e in chain):
        return ("client not installed on the worker",
                "install it there: pip install 'accum[trackers]'")
    where = _SERVER_SETTING.get(tracker, "the tracker's settings")
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or any(
            "refused" in str(e).lower() for e in chain):
        return "server refused the connection", f"is it running at {where}?"
    if any(isinstance(e, TimeoutError | ConnectionError) for e in chain) or any(
            text in str(e).lower() for e in chain for text in _UNREACHABLE_TEXT):
        return "server unreachable (no answer)", f"is it running, and reachable at {where}?"
    return f"failed ({type(exc).__name__})", "the worker's log has the client's error"


def steps_of(raw: list[dict[str, Any]]) -> list[StepPoints]:
    """The trainer's dicts as one entry per step (an evaluation joins its step's metrics),
    numbers only, without ``step`` and ``epoch``; in the order of their first dict."""
    by_step: dict[int, StepPoints] = {}
    for metrics in raw:
        step = int(metrics["step"])
        values = {k: float(v) for k, v in metrics.items() if type(v) in NUMBER and k not in SKIP}
        if (known := by_step.get(step)) is None:
            by_step[step] = StepPoints(step, values)
        else:
            known.values.update(values)
    return list(by_step.values())


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
