"""``accum worker --cpu-ranks K``: a worker without GPUs that offers K CPU ranks (gloo) to
``gpus: k`` jobs, registered as such in ``GET /v1/workers``; the fleet check reads its ranks
from the registry. Beside it, a worker with neither GPUs nor CPU ranks is never the one that
trains a ``gpus: 2`` job: it leaves the job to the ranked worker, which the fleet counts even
stopped (within ``ACCUM_QUEUE_GRACE_S``; tests/worker/test_worker_ranks.py fails one no worker
registered ranks for). Real workers, a real API process, SQLite and PostgreSQL + Redis.

    .venv/bin/python -m pytest tests/reliability/test_cpu_ranks_worker.py -x -q
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_process import running_api
from worker_stack import BASE_SPEC, Stack

from services.jobdb import tokens

# Two worker starts and a job's two rank processes each import torch: minutes on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

JOB = {**BASE_SPEC, "max_steps": 4, "checkpoint_every": 2, "gpus": 2}


def listed_workers(url: str, headers: dict[str, str], names: set[str], own: Stack) -> dict[str, Any]:
    """``GET /v1/workers`` once every one of ``names`` is idle or busy there."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        items = httpx.get(f"{url}/v1/workers", headers=headers, timeout=10).json()["items"]
        found = {w["name"]: w for w in items if w["name"] in names}
        if set(found) == names and all(w["state"] in ("idle", "busy") for w in found.values()):
            return found
        time.sleep(0.2)
    pytest.fail(f"workers {names} not all registered within 240 s\n{own.worker_logs()}")


def left_waiting(own: Stack, job_id: str, plain: str) -> Any:
    """The job once the plain worker has had its message at least twice (the first send and
    the reaper's re-send) and left it."""
    log = own.logs / f"worker-{list(own.hostnames).index(plain)}.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count(f"job {job_id} asks for more ranks") >= 2:
            return own.job(job_id)
        time.sleep(0.2)
    pytest.fail(f"the plain worker never left job {job_id}\n{own.worker_logs()}")


def test_a_cpu_ranks_worker_trains_gpus_2_jobs_and_a_plain_one_never_does(
    stack: Stack, tmp_path: Path, record_figure: Any
) -> None:
    own = stack.variant(tmp_path)
    own.start_worker()
    own.start_worker(args=("--cpu-ranks", "2"))
    plain, ranked = list(own.hostnames)
    with own.sessions.begin() as session:
        own.owner, token = tokens.create_owner_with_token(session, f"ranks-{tmp_path.name[-8:]}")
    headers = {"Authorization": f"Bearer {token}"}
    spec = {**JOB, "queue": own.queue}
    try:
        with running_api(own.env(), own.logs / "api.log") as api:
            workers = listed_workers(api.url, headers, {plain, ranked}, own)
            too_many = httpx.post(f"{api.url}/v1/jobs", json={**spec, "gpus": 3}, headers=headers, timeout=30)
            # Either worker may take its message: the plain one leaves it to the ranked one.
            accepted = httpx.post(f"{api.url}/v1/jobs", json=spec, headers=headers, timeout=30)
            assert accepted.status_code == 201, accepted.text
            trained = [own.wait(accepted.json()["id"], timeout=400)]

            # The ranked worker stops; within ACCUM_QUEUE_GRACE_S the fleet still counts it (it
            # may come back), so the submit is taken, and the plain worker leaves it waiting.
            own.hostnames[ranked].send_signal(signal.SIGTERM)
            own.hostnames[ranked].wait(timeout=60)
            orphan = httpx.post(f"{api.url}/v1/jobs", json=spec, headers=headers, timeout=30)
            assert orphan.status_code == 201, orphan.text
            waiting = left_waiting(own, orphan.json()["id"], plain)
    finally:
        own.stop_workers()
    record_figure(
        f"cpu_ranks_worker_{stack.name}", area="limits",
        check="a --cpu-ranks 2 worker beside a plain CPU worker on one queue, gpus: 2 jobs "
              f"through the API, then the ranked worker stopped ({stack.name})",
        figure=f"registered ranks {workers[ranked]['devices'][0].get('ranks')}; gpus: 3 -> "
               f"{too_many.status_code}; gpus: 2 job {trained[0].status} on the "
               f"{'ranked' if trained[0].worker_name == ranked else 'PLAIN'} worker in "
               f"{trained[0].attempts} attempt; with the ranked one stopped: {waiting.status}, "
               f"{waiting.attempts} attempts",
        passed=(too_many.status_code == 422 and all(j.status == "succeeded" and j.worker_name == ranked
                                                      for j in trained) and (waiting.status, waiting.attempts) == ("queued", 0)),
    )

    assert workers[ranked]["devices"][0] == {**workers[ranked]["devices"][0], "kind": "cpu", "ranks": 2}
    assert "ranks" not in workers[plain]["devices"][0]
    assert too_many.status_code == 422, too_many.text
    (error,) = too_many.json()["errors"]
    assert error["loc"] == "body.gpus" and error["allowed"] == [0, 1, 2]
    for job in trained:
        assert job.status == "succeeded", (job.error, own.worker_logs())
        assert job.worker_name == ranked and job.attempts == 1, (job.worker_name, job.attempts)
        assert job.progress["optimizer_step"] == JOB["max_steps"]
    assert (waiting.status, waiting.attempts) == ("queued", 0), (waiting.status, waiting.error)
