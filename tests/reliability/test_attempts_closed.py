"""Every path that ends an attempt closes its row (``job_attempts``) with the right outcome and
the attempt's own steps: success, failure, cancel, timeout, lost lease (``kill -9``), store
fault (the S3 server stopped past a lease timeout) and worker shutdown (SIGTERM). Real worker
processes on two nodes, checkpoints on S3 (moto in server mode), SQLite and PostgreSQL +
Redis; the attempts are read as users read them, from ``GET /v1/jobs/{id}`` of a real API
process. Before the fix an attempt handed back after a store fault stayed ``running`` with
no ``ended_at``, its ``steps_done`` counted from the next attempt's progress.

    .venv/bin/python -m pytest tests/reliability/test_attempts_closed.py -x -q
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_process import running_api
from worker_stack import Stack

from services.jobdb import tokens
from services.jobdb.models import JobAttempt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # real workers: minutes on a loaded machine

# Short enough for the lost lease and the store fault to take seconds; a machine loaded past
# 6 s without a heartbeat still loses a lease now and then: an extra ``lost`` attempt, allowed.
LEASES = {"lease_timeout_s": 6.0, "heartbeat_interval_s": 1.0, "reaper_interval_s": 0.2}
# path -> (how its first attempt ends, how its job's last attempt ends)
EXPECTED = {
    "success": ("succeeded", "succeeded"),
    "failure": ("failed", "failed"),
    "cancel": ("cancelled", "cancelled"),
    "timeout": ("failed", "failed"),
    "lost lease": ("lost", "succeeded"),
    "worker shutdown": ("handed_back", "succeeded"),
    "store fault": ("store_fault", "succeeded"),
}
# Long enough to be stopped mid-run on a loaded machine, short enough to finish after a resume.
RESUMED = {"max_steps": 300, "checkpoint_every": 20, "keep_checkpoints": 2, "max_restarts": 10}
ENDLESS = {"max_steps": 10_000_000, "checkpoint_every": 50, "keep_checkpoints": 2}
TIMEOUT_S = 3
WAIT_S = 300  # per job: the first one on fresh workers took over 90 s at load 20 on 2 cores


def start_node(own: Stack, home: Path) -> None:
    """A worker with its own ACCUM_HOME and cache: a node sharing only the database and S3,
    consuming before the walk goes on (a node still starting when the S3 server is stopped
    would refuse to start, by design, instead of meeting the store fault mid-job)."""
    own.wait_ready(own.start_worker(ACCUM_HOME=str(home), ACCUM_CACHE_DIR=str(home / "cache")))


def mid_run(own: Stack, job_id: str, step: int = 20) -> None:
    own.wait(job_id, ("running",), timeout=WAIT_S,
             check=lambda job: (job.progress or {}).get("optimizer_step", 0) >= step)


def attempt_outcomes(own: Stack, job_id: str) -> list[str]:
    with own.sessions() as session:
        rows = session.query(JobAttempt).filter_by(job_id=job_id).order_by(JobAttempt.attempt)
        return [row.outcome or "running" for row in rows]


def walk_every_path(own: Stack, s3_server: Any, nodes: Path) -> dict[str, str]:
    """Ends one job by each path; returns path -> job id."""
    jobs: dict[str, str] = {}
    jobs["success"] = own.create(max_steps=12)
    own.wait(jobs["success"], timeout=WAIT_S)
    jobs["failure"] = own.create(dataset={"name": "imagefolder", "data_root": "/nonexistent/images"})
    own.wait(jobs["failure"], timeout=WAIT_S)

    jobs["cancel"] = own.create(**ENDLESS)
    mid_run(own, jobs["cancel"])
    own.cancel(jobs["cancel"])
    own.wait(jobs["cancel"], timeout=WAIT_S)

    jobs["timeout"] = own.create(**ENDLESS, timeout=TIMEOUT_S)
    own.wait(jobs["timeout"], timeout=WAIT_S)

    jobs["lost lease"] = own.create(**RESUMED)
    mid_run(own, jobs["lost lease"])
    victim = own.process_holding(jobs["lost lease"])
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    start_node(own, nodes / "node3")
    own.wait(jobs["lost lease"], timeout=WAIT_S)

    jobs["worker shutdown"] = own.create(**RESUMED)
    mid_run(own, jobs["worker shutdown"])
    stopping = own.process_holding(jobs["worker shutdown"])
    stopping.send_signal(signal.SIGTERM)
    stopping.wait(timeout=60)
    start_node(own, nodes / "node4")
    own.wait(jobs["worker shutdown"], timeout=WAIT_S)

    jobs["store fault"] = own.create(**RESUMED)
    mid_run(own, jobs["store fault"])
    s3_server.stop()
    try:
        own.wait(jobs["store fault"], ("queued", "running", "failed"), timeout=WAIT_S,
                 check=lambda job: "store_fault" in attempt_outcomes(own, job.id))
    finally:
        s3_server.start()
    own.wait(jobs["store fault"], timeout=WAIT_S)
    return jobs


def test_every_path_closes_its_attempt_with_its_outcome_and_own_steps(
    stack: Stack, tmp_path: Path, s3_url: str, s3_server: Any, record_figure: Any
) -> None:
    own = stack.variant(tmp_path, artifacts_url=s3_url, **LEASES)
    for node in ("node1", "node2"):
        start_node(own, tmp_path / node)
    with own.sessions.begin() as session:
        own.owner, token = tokens.create_owner_with_token(session, f"attempts-{tmp_path.name[-8:]}")
    try:
        jobs = walk_every_path(own, s3_server, tmp_path)
        with running_api(own.env(), own.logs / "api.log") as api:
            answers = {
                path: httpx.get(f"{api.url}/v1/jobs/{job_id}", timeout=30,
                                headers={"Authorization": f"Bearer {token}"}).json()
                for path, job_id in jobs.items()
            }
    finally:
        s3_server.ensure_running()
        own.stop_workers()

    outcomes = {path: [a["outcome"] for a in job["attempts"]] for path, job in answers.items()}
    open_rows = [(path, a["attempt"]) for path, job in answers.items() for a in job["attempts"]
                 if a["outcome"] == "running" or a["ended_at"] is None or a["end_step"] is None]
    record_figure(
        f"attempts_closed_{stack.name}", area="fault",
        check="one job ended by each path (success, failure, cancel, timeout, lost lease, "
              f"store fault, worker shutdown), attempts read from GET /v1/jobs/ID ({stack.name})",
        figure=f"{sum(len(o) for o in outcomes.values()) - len(open_rows)} of "
               f"{sum(len(o) for o in outcomes.values())} attempts closed; outcomes {outcomes}",
        passed=not open_rows,
    )

    assert not open_rows, (open_rows, outcomes, own.worker_logs())
    for path, (first, last) in EXPECTED.items():
        ended = outcomes[path]
        assert (ended[0], ended[-1]) == (first, last), (path, outcomes)
        # Between them only what the store outage or the machine's load makes: more store
        # faults while the store is down, a lease that lapsed.
        assert set(ended[1:-1]) <= {"store_fault", "lost"}, (path, outcomes)
    assert answers["timeout"]["error"]["reason"] == "timeout"
    faults = outcomes["store fault"].count("store_fault")
    assert own.job(jobs["store fault"]).restarts == faults + outcomes["store fault"].count("lost")

    for path, job in answers.items():
        attempts = job["attempts"]
        for attempt in attempts:  # each attempt's steps are its own, from where it started
            assert attempt["steps_done"] == attempt["end_step"] - (attempt["resume_step"] or 0) >= 0
        for before, after in zip(attempts, attempts[1:], strict=False):
            assert (after["resume_step"] or 0) <= before["end_step"], (path, attempts)
        assert attempts[-1]["end_step"] == job["progress"]["optimizer_step"], (path, job)
    assert answers["success"]["attempts"][0]["steps_done"] == 12
    assert answers["failure"]["attempts"][0]["steps_done"] == 0  # failed before its first step
    # Stopped mid-run, then run to the end from where it resumed.
    for path in ("lost lease", "worker shutdown", "store fault"):
        first, last = answers[path]["attempts"][0], answers[path]["attempts"][-1]
        assert first["steps_done"] >= 20 and last["end_step"] == RESUMED["max_steps"], answers[path]
    # A SIGTERM checkpoints where it stopped: the next attempt starts at the step it ended.
    shutdown = answers["worker shutdown"]["attempts"]
    assert shutdown[1]["resume_step"] == shutdown[0]["end_step"], shutdown
