"""The worker's own Prometheus endpoint (ACCUM_WORKER_METRICS_PORT), scraped over HTTP from a
real ``python -m services.worker`` process: its upload seconds and bytes match the checkpoints
its jobs recorded, with the default solo pool and with ``--pool prefork``, where each job (and
its uploads) runs in a child process, and from a multi-GPU job's rank 0; a checkpoint it cannot
fetch counts as a store error; a port it cannot bind stops it with one line."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from worker_stack import ROOT, Stack, make_stack

from services.artifacts import open_store
from services.jobdb import checkpoints, events
from services.jobdb.models import Job
from services.ports import free_port


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the endpoint serves: (name, sorted labels) -> value."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def checkpoint_events(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    with stack.sessions() as session:
        return [e.data for e in events.list_events(session, job_id, limit=1000) if e.kind == "checkpoint"]


def store_faults(stack: Stack, job_id: str) -> int:
    return sum(kind == "store_fault" for kind in stack.event_kinds(job_id))


@pytest.fixture
def sqlite_stack(tmp_path: Path, request: pytest.FixtureRequest) -> Stack:
    return make_stack("sqlite", tmp_path, request)


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_uploads_and_store_errors_are_served_from_where_they_ran(sqlite_stack: Stack, pool: str) -> None:
    stack, port = sqlite_stack, free_port()
    stack.start_worker(pool=pool, ACCUM_WORKER_METRICS_PORT=str(port))
    try:
        first = stack.create(max_steps=12, checkpoint_every=4)
        second = stack.create(max_steps=8, checkpoint_every=4, seed=1)
        stack.wait(first)
        stack.wait(second)
        uploads = checkpoint_events(stack, first) + checkpoint_events(stack, second)
        served = scrape(port)

        # A resume whose checkpoint object is gone: a fetch error, once per attempt.
        broken = stack.create(max_steps=4, checkpoint_every=2, max_restarts=1, seed=2)
        stack.wait(broken)
        with stack.sessions() as session:
            latest = checkpoints.list_checkpoints(session, broken)[-1]
        open_store(stack.settings.artifacts_url).delete(latest.key)
        (stack.settings.cache_path / "objects" / latest.key).unlink()  # this node's copy too
        with stack.sessions.begin() as session:
            session.get(Job, broken).status = "failed"  # type: ignore[union-attr]
        stack.resume(broken)
        stack.wait(broken, ("failed",), timeout=120)
        after = scrape(port)
    finally:
        stack.stop_workers()

    assert len(uploads) == 5  # steps 4, 8, 12 and 4, 8
    assert served[("accum_worker_checkpoint_upload_seconds_count", ())] == len(uploads)
    assert served[("accum_worker_checkpoint_upload_bytes_count", ())] == len(uploads)
    assert served[("accum_worker_checkpoint_upload_bytes_sum", ())] == sum(u["size_bytes"] for u in uploads)
    assert served[("accum_worker_checkpoint_upload_seconds_sum", ())] > 0
    faults = store_faults(stack, broken)
    assert faults >= 1
    fetch_errors = ("accum_worker_store_errors_total", (("error", "ObjectMissing"), ("operation", "fetch")))
    assert after[fetch_errors] == faults
    assert after[("accum_worker_checkpoint_upload_bytes_count", ())] == len(uploads) + 2  # broken's own


@pytest.mark.slow
def test_a_multi_gpu_jobs_uploads_are_served_from_its_rank_0(sqlite_stack: Stack) -> None:
    # Rank 0 of a `gpus: 2` job is a spawned process of its own: it inherits the worker's
    # multiprocess directory, and the endpoint sums its files with the worker's.
    stack, port = sqlite_stack, free_port()
    stack.start_worker(ACCUM_WORKER_METRICS_PORT=str(port), ACCUM_CPU_RANKS="2")
    try:
        job = stack.create(max_steps=8, checkpoint_every=4, gpus=2)
        stack.wait(job)
        served = scrape(port)
    finally:
        stack.stop_workers()
    uploads = checkpoint_events(stack, job)
    assert len(uploads) == 2  # steps 4 and 8, written and uploaded by rank 0 alone
    assert served[("accum_worker_checkpoint_upload_bytes_count", ())] == 2
    assert served[("accum_worker_checkpoint_upload_bytes_sum", ())] == sum(u["size_bytes"] for u in uploads)


@pytest.mark.slow
def test_a_metrics_port_in_use_stops_the_worker_with_one_line(sqlite_stack: Stack) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "services.worker", "--queues", sqlite_stack.queue],
            cwd=ROOT, env={**sqlite_stack.env(), "ACCUM_WORKER_METRICS_PORT": str(port)},
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr
    assert "ACCUM_WORKER_METRICS_PORT" in result.stderr and "Traceback" not in result.stderr


def test_no_port_no_endpoint() -> None:
    from services.settings import Settings
    from services.worker.metrics_server import serve_metrics

    assert Settings().worker_metrics_port == 0
    assert serve_metrics(Settings()) is None
