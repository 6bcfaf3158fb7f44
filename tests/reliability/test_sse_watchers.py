"""Many watchers on one job's live stream (issue 7): through a real uvicorn API and a real
worker on PostgreSQL + Redis, every watcher connected before the job starts receives every
optimizer step's metrics exactly once, in order, then the job's final outcome.

The worker's throughput with 100 watchers vs none is a figure of `bench/service/load.py` (its ``sse``
phase), not asserted here.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from api_process import running_api
from worker_stack import Stack

from accum import AccumClient
from services.dispatch.enqueue import enqueue_job
from services.jobdb import tokens

STEPS = 300
# Per-step metric names the trainer always reports (docs/architecture.md, on_step).
STEP_METRICS = ("loss", "lr", "grad_norm", "samples_per_s")


@dataclass
class Watched:
    """What one watcher received."""

    steps: dict[str, list[int]] = field(default_factory=dict)
    event_kinds: list[str] = field(default_factory=list)
    end: dict[str, Any] | None = None
    first: list[tuple[float, str, Any]] = field(default_factory=list)  # for failure messages


def watch(url: str, token: str, job_id: str, connected: threading.Semaphore) -> Watched:
    """Follow the stream to its `end`, as `accum watch` does; release `connected` on the
    first message (the stream is open and has read the job)."""
    seen = Watched()
    with AccumClient(url, token) as client:
        for index, (event, data) in enumerate(client.stream_events(job_id)):
            if index == 0:
                connected.release()
            if len(seen.first) < 8:
                seen.first.append((round(time.monotonic(), 3), event, data.get("step", data.get("status"))))
            if event == "metric":
                seen.steps.setdefault(data["name"], []).append(data["step"])
            elif event == "job_event":
                seen.event_kinds.append(data["kind"])
            elif event == "end":
                seen.end = data
    return seen


@pytest.mark.parametrize("stack", ["postgres_redis"], indirect=True)
@pytest.mark.parametrize(
    "watchers", [20, pytest.param(100, marks=pytest.mark.reliability_slow)]
)
def test_every_watcher_gets_every_step_once_and_the_outcome(
    stack: Stack, watchers: int, record_figure: Any
) -> None:
    with stack.sessions.begin() as session:
        _, token = tokens.create_owner_with_token(session, f"watch-{os.getpid()}", admin=True)
    # The job waits on a queue of its own until every stream is open (a stream starts at the
    # job's present step; the reaper re-sends a queued job's message after a few seconds, so
    # holding back the message alone would not hold the job): then a worker for it starts.
    held = replace(stack, queue=f"sse-{uuid.uuid4().hex[:8]}", logs=stack.logs / uuid.uuid4().hex[:8],
                   owner=None, workers=[], hostnames={})
    held.logs.mkdir()
    job_id = held.create(enqueue=False, max_steps=STEPS, checkpoint_every=1000,
                         micro_batch_size=32, accumulation_steps=2)
    connected = threading.Semaphore(0)
    # The API stops first on the way out, so a stuck stream ends instead of hanging the pool.
    with ThreadPoolExecutor(watchers) as pool, running_api(stack.env(), held.logs / "api.log") as api:
        futures = [pool.submit(watch, api.url, token, job_id, connected) for _ in range(watchers)]
        for _ in range(watchers):
            assert connected.acquire(timeout=60), "a watcher's stream did not open"
        assert held.job(job_id).status == "queued"
        try:
            held.start_worker()
            enqueue_job(held.settings, job_id, held.queue)
            held.wait(job_id, timeout=240)
        finally:
            held.stop_workers()
        seen = [future.result(timeout=120) for future in futures]

    expected = list(range(1, STEPS + 1))
    complete = [
        w for w in seen
        if all(w.steps.get(name) == expected for name in STEP_METRICS)
        and w.event_kinds.count("succeeded") == 1
        and w.end == {"status": "succeeded"}
    ]
    record_figure(
        f"sse_watchers_{watchers}" if watchers != 100 else "sse_watchers",
        area="load",
        check=f"{watchers} SSE watchers on one job of {STEPS} steps (real API + worker)",
        figure=f"{len(complete)}/{watchers} watchers got all {STEPS} steps once + outcome",
        passed=len(complete) == watchers,
    )
    for w in seen:
        for name in STEP_METRICS:
            got = w.steps.get(name, [])
            assert got == expected, (
                f"{len(complete)}/{watchers} watchers complete; one got {name} for "
                f"{len(got)} steps, missing {sorted(set(expected) - set(got))[:10]}..., "
                f"repeated {len(got) - len(set(got))}; its first messages: {w.first[:8]}"
            )
        assert w.event_kinds.count("succeeded") == 1 and w.end == {"status": "succeeded"}
    assert len(complete) == watchers
