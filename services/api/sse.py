"""The live job stream (`Accept: text/event-stream`): events, metrics and status until the end.

Messages follow docs/architecture.md: `job_event`, `metric`, `status` (the job object, when
its status or progress changes), then `end` with the final status, and the stream closes.

The stream polls the database every `POLL_INTERVAL_S` with short sessions (no connection is
held between polls, so a thousand watchers do not pin the pool) and remembers what it has sent:
the last event id, and per metric name the highest step sent. A new attempt of the job (a
restart from a checkpoint) lowers those steps to the checkpoint's, so its rewritten steps are
sent again.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic_core import to_jsonable_python
from sqlalchemy.orm import Session, sessionmaker

from services.api.schemas import EventPublic, JobPublic
from services.store import events as store_events
from services.store import metrics as store_metrics
from services.store.jobs import is_finished, load_job
from services.store.metric_points import read_metric_points
from services.store.models import Job

POLL_INTERVAL_S = 0.5
# A comment line after this much silence: proxies and clients see traffic and keep the
# connection open through hours of a quiet job.
KEEP_ALIVE_S = 15.0
KEEP_ALIVE = b": keep-alive\n\n"
METRICS_PER_POLL = 5000
EVENTS_PER_POLL = 500
NAMES_REFRESH_S = 5.0


TERMINAL_EVENT_KINDS = frozenset({"succeeded", "failed", "cancelled"})


def sse_message(event: str, data: Any, event_id: int | None = None) -> bytes:
    """One SSE message: `event: <type>` and a single-line JSON `data:` field (values encoded
    as the REST answers encode them, e.g. timestamps). Job events carry their id, so a client
    that reconnects with `Last-Event-ID` continues after the last one it saw."""
    payload = json.dumps(to_jsonable_python(data), separators=(",", ":"))
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {payload}\n\n".encode()


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


def _job_snapshot(job: Job) -> tuple[Any, ...]:
    return (job.status, job.attempts, json.dumps(job.progress, sort_keys=True), job.finished_at)


def open_stream(session: Session, job: Job) -> StreamState:
    """Start metrics at the present (history is `GET .../metrics`) and events at the beginning
    (a handful of lifecycle lines that a watcher wants to see)."""
    return StreamState(metric_steps=store_metrics.latest_steps(session, job.id), attempts=job.attempts)


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
            out.append(sse_message("status", JobPublic.from_row(job)))
        endings: list[bytes] = []
        for event in store_events.list_events(
            session, job_id, after_id=state.last_event_id, limit=EVENTS_PER_POLL
        ):
            state.last_event_id = event.id
            message = sse_message("job_event", EventPublic.from_row(event), event.id)
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
    rows = []
    for name in names:
        page, _ = read_metric_points(
            session, job.id, name=name, since_step=state.metric_steps.get(name), limit=METRICS_PER_POLL
        )
        if page:
            state.metric_steps[name] = page[-1].step
            rows.extend(page)
    rows.sort(key=lambda m: (m.step, m.name))
    return [
        sse_message(
            "metric",
            {"name": m.name, "step": m.step, "epoch": m.epoch, "value": m.value, "ts": m.ts},
        )
        for m in rows
    ]


async def job_stream(
    session_factory: sessionmaker[Session], job_id: str, state: StreamState
) -> AsyncIterator[bytes]:
    """The SSE body: poll, send what is new, keep the connection alive, stop after `end`."""
    last_sent = time.monotonic()
    while True:
        messages, finished = await anyio.to_thread.run_sync(poll, session_factory, job_id, state)
        if messages:
            yield b"".join(messages)
            last_sent = time.monotonic()
        if finished:
            return
        if time.monotonic() - last_sent >= KEEP_ALIVE_S:
            yield KEEP_ALIVE
            last_sent = time.monotonic()
        await anyio.sleep(POLL_INTERVAL_S)
