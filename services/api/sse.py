"""The live job stream (`Accept: text/event-stream`): events, metrics and status until the end.

Messages follow docs/architecture.md: `job_event`, `metric`, `status` (the job object as
`GET /v1/jobs/{id}` answers it, `job_view`, when its status or progress changes), then `end`
with the final status, and the stream closes.

The stream polls the database every `POLL_INTERVAL_S` with short sessions (no connection is
held between polls, so a thousand watchers do not pin the pool) and remembers what it has sent:
the last event id, and per metric name the highest step sent. A new attempt of the job (a
restart from a checkpoint) lowers those steps to the checkpoint's, so its rewritten steps are
sent again.

A database outage does not end the stream: a poll that cannot reach the database sends
nothing (keep-alives go on) and the next one picks up where the last good one stopped, so a
watcher sees every step once across a PostgreSQL restart.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic_core import to_json
from sqlalchemy.orm import Session, sessionmaker

from services.api.job_view import job_view
from services.api.schemas import EventPublic, metric_point
from services.jobdb import events as store_events
from services.jobdb import metrics as store_metrics
from services.jobdb.db import database_unreachable
from services.jobdb.jobs import is_finished, load_job
from services.jobdb.metrics import read_new_points
from services.jobdb.models import Job
from services.jobdb.status import FINISHED

POLL_INTERVAL_S = 0.5
# A comment line after this much silence: proxies and clients see traffic and keep the
# connection open through hours of a quiet job.
KEEP_ALIVE_S = 15.0
KEEP_ALIVE = b": keep-alive\n\n"
# Proxies must pass each message on at once (nginx buffers without the second).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
METRICS_PER_POLL = 5000
EVENTS_PER_POLL = 500
NAMES_REFRESH_S = 5.0


# A finished attempt writes an event named after its status (``leases.finish_job``).
TERMINAL_EVENT_KINDS = FINISHED


def sse_message(event: str, data: Any, event_id: int | None = None) -> bytes:
    """One SSE message: `event: <type>` and a single-line JSON `data:` field (values encoded
    as the REST answers encode them: timestamps, and a NaN or infinity as null, since a bare
    NaN would make a browser's JSON.parse throw). Job events carry their id, so a client
    that reconnects with `Last-Event-ID` continues after the last one it saw."""
    payload = to_json(data, inf_nan_mode="null")
    head = f"id: {event_id}\n" if event_id is not None else ""
    return b"%sevent: %s\ndata: %s\n\n" % (head.encode(), event.encode(), payload)


@dataclass
class StreamState:
    """What this stream has sent so far."""

    last_event_id: int | None = None
    # Per metric name, the highest step sent. Per name, because an eval metric for step s may
    # be committed after the training metrics of s (and reading by name is an index range).
    metric_steps: dict[str, int] = field(default_factory=dict)
    names_checked_at: float = 0.0
    attempts: int | None = None
    job_snapshot: tuple[Any, ...] | None = None
    # The job's owner, named in `status` messages as GET /v1/jobs/{id} names it.
    owner_name: str | None = None


def _job_snapshot(job: Job) -> tuple[Any, ...]:
    return (job.status, job.attempts, json.dumps(job.progress, sort_keys=True), job.finished_at)


def open_stream(session: Session, job: Job, owner_name: str | None = None) -> StreamState:
    """Start metrics at the present (history is `GET .../metrics`) and events at the beginning
    (a handful of lifecycle lines that a watcher wants to see)."""
    return StreamState(metric_steps=store_metrics.latest_steps(session, job.id),
                       attempts=job.attempts, owner_name=owner_name)


def poll(
    session_factory: sessionmaker[Session], job_id: str, state: StreamState
) -> tuple[list[bytes], bool]:
    """New messages since the last poll, and whether the stream is over."""
    out: list[bytes] = []
    with session_factory() as session:
        # The job first: if it is finished now, everything it wrote is committed already and
        # the reads below see it, so `end` never overtakes the job's last events or metrics.
        job = load_job(session, job_id)
        if job is None:  # deleted while watched
            return [sse_message("end", {"status": "deleted"})], True
        if state.attempts is not None and job.attempts != state.attempts:
            # A new attempt rewrites the steps after its checkpoint: send those again.
            floor = job.resume_step or 0
            state.metric_steps = {n: min(s, floor) for n, s in state.metric_steps.items()}
        state.attempts = job.attempts
        snapshot = _job_snapshot(job)
        if snapshot != state.job_snapshot:
            state.job_snapshot = snapshot
            state.names_checked_at = 0.0  # progress moved: new metric names may have appeared
            out.append(sse_message("status", job_view(session, job, state.owner_name)))
        endings: list[bytes] = []
        for event in store_events.list_events(
            session, job_id, after_id=state.last_event_id, limit=EVENTS_PER_POLL
        ):
            state.last_event_id = event.id
            message = sse_message("job_event", EventPublic.model_validate(event), event.id)
            # A final outcome goes after the metrics read in the same poll: the job's last
            # evaluation was written before it finished, and a watcher should see it so.
            (endings if event.kind in TERMINAL_EVENT_KINDS else out).append(message)
        out.extend(_new_metrics(session, job, state))
        out.extend(endings)
        finished = is_finished(job)
    if finished:
        out.append(sse_message("end", {"status": job.status}))
    return out, finished


def _new_metrics(session: Session, job: Job, state: StreamState) -> list[bytes]:
    names = set(state.metric_steps) | set(job.latest_metrics or {})
    now = time.monotonic()
    if now - state.names_checked_at >= NAMES_REFRESH_S:
        # Names the job row does not mention (latest_metrics is the worker's choice): one
        # lookup of the job's metric names, when progress moved or every few seconds.
        state.names_checked_at = now
        names |= set(store_metrics.metric_names(session, job.id))
    frontiers = {name: state.metric_steps.get(name) for name in names}
    rows = read_new_points(session, job.id, frontiers, limit=METRICS_PER_POLL)
    for m in rows:  # ordered by (name, step): each name ends at its highest step sent
        state.metric_steps[m.name] = m.step
    rows.sort(key=lambda m: (m.step, m.name))
    return [metric_message(m.name, m.step, m.epoch, m.value, m.ts) for m in rows]


@functools.lru_cache(maxsize=16_384)  # ~10 s of a fast job's rows, ~5 MB
def metric_message(name: str, step: int, epoch: int | None, value: float | None, ts: Any) -> bytes:
    """One `metric` message, the same object as a point of `GET .../metrics` (with its
    `nonfinite` label). Every watcher of a job sends the same rows: encoded once per row
    (not once per watcher), since encoding was most of the API's work with 100 watchers."""
    return sse_message("metric", metric_point(name, step, epoch, value, ts))


# --- one database poll per job and tick, shared by the streams that are in step -------------
#
# Streams poll on a common clock (multiples of POLL_INTERVAL_S). The streams of one job that
# have sent the same things so far (same last event, metric steps and job snapshot: after
# their first poll, nearly all of them) need the same answer at the same tick, so the first
# reads the database and the others reuse its messages and its new state: a hundred watchers
# cost about one (bench/service/load.py, sse phase). A stream out of step polls on its own.


@dataclass
class _SharedPoll:
    tick: int
    key: tuple[Any, ...]
    messages: list[bytes]
    finished: bool
    state: StreamState


_shared: dict[tuple[int, str], _SharedPoll] = {}
_job_locks: dict[tuple[int, str], threading.Lock] = {}
_registry_lock = threading.Lock()
_swept_at_tick = -1  # the registry is swept once per tick, not after every stream's poll


def _sent_so_far(state: StreamState) -> tuple[Any, ...]:
    return (state.last_event_id, tuple(sorted(state.metric_steps.items())), state.attempts,
            state.job_snapshot)


def _copy_state(source: StreamState, target: StreamState) -> None:
    """Every field of ``source`` into ``target`` (the metric steps as a copy of their own)."""
    for name in (f.name for f in dataclasses.fields(StreamState)):
        setattr(target, name, getattr(source, name))
    target.metric_steps = dict(source.metric_steps)


def shared_poll(
    session_factory: sessionmaker[Session], job_id: str, state: StreamState, tick: int
) -> tuple[list[bytes], bool]:
    """``poll``, or the answer another stream of this job in the same state got at ``tick``."""
    job_key = (id(session_factory), job_id)
    with _registry_lock:
        lock = _job_locks.setdefault(job_key, threading.Lock())
    with lock:
        key, last = _sent_so_far(state), _shared.get(job_key)
        if last is not None and last.tick == tick and last.key == key:
            _copy_state(last.state, state)
            return last.messages, last.finished
        messages, finished = poll(session_factory, job_id, state)
        kept = StreamState()
        _copy_state(state, kept)
        _shared[job_key] = _SharedPoll(tick, key, messages, finished, kept)
    global _swept_at_tick
    with _registry_lock:  # forget jobs nobody polled lately
        if _swept_at_tick != tick:
            _swept_at_tick = tick
            for old in [k for k, v in _shared.items() if v.tick < tick - 2]:
                del _shared[old]
                _job_locks.pop(old, None)
    return messages, finished


REVOKED = "the token of this stream was revoked; open it again with a valid token"


async def job_stream(
    session_factory: sessionmaker[Session],
    job_id: str,
    state: StreamState,
    *,
    token_live: Callable[[], bool] | None = None,
    recheck_s: float = 10.0,
) -> AsyncIterator[bytes]:
    """The events stream's body: ``polled_stream`` over ``shared_poll``."""

    def poll_once() -> tuple[list[bytes], bool]:
        nonlocal state
        # The poll works on a copy: one that fails half-way must not mark messages as sent.
        trial = dataclasses.replace(state, metric_steps=dict(state.metric_steps))
        tick = int(time.monotonic() // POLL_INTERVAL_S)
        messages, finished = shared_poll(session_factory, job_id, trial, tick)
        state = trial
        return messages, finished

    async for chunk in polled_stream(poll_once, token_live=token_live, recheck_s=recheck_s):
        yield chunk


async def polled_stream(
    poll_once: Callable[[], tuple[list[bytes], bool]],
    *,
    token_live: Callable[[], bool] | None = None,
    recheck_s: float = 10.0,
) -> AsyncIterator[bytes]:
    """An SSE body: ``poll_once()`` (in a thread) every ``POLL_INTERVAL_S``, what it returns
    sent, the connection kept alive, stopped once it says finished (the events stream, and
    the logs stream of ``GET /v1/jobs/{id}/logs``).

    Every `recheck_s` the stream asks `token_live()` whether the token that opened it still
    authenticates; once it does not, it sends `event: error` (status 401) and closes. A poll
    that cannot reach the database sends nothing; the next one picks up from the last good."""
    last_sent = checked_at = time.monotonic()
    while True:
        if token_live is not None and time.monotonic() - checked_at >= recheck_s:
            checked_at = time.monotonic()
            try:
                live = await anyio.to_thread.run_sync(token_live)
            except Exception as exc:
                if not database_unreachable(exc):
                    raise
                live = True  # an outage is not a revocation: asked again next time
            if not live:
                yield sse_message("error", {"status": 401, "detail": REVOKED})
                return
        try:
            messages, finished = await anyio.to_thread.run_sync(poll_once)
        except Exception as exc:
            if not database_unreachable(exc):
                raise
            messages, finished = [], False
        if messages:
            yield b"".join(messages)
            last_sent = time.monotonic()
        if finished:
            return
        if time.monotonic() - last_sent >= KEEP_ALIVE_S:
            yield KEEP_ALIVE
            last_sent = time.monotonic()
        await anyio.sleep(POLL_INTERVAL_S - time.monotonic() % POLL_INTERVAL_S)  # the next tick
