"""SIGTERM to a worker in the middle of a job (a deploy, a node drain): the worker stops the
job within a micro-batch, checkpoints its last finished window, hands the job back to the
queue and exits; another worker resumes from that checkpoint, without waiting for a lease to
expire and without counting a restart, to the final weights of an uninterrupted run, with
every metric step exactly once. Real worker processes, SQLite and PostgreSQL + Redis, with the
default solo pool and with ``--pool prefork``, where the job runs in a child that Celery's warm
shutdown never signals (it must still see the request and hand the job back).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from worker_stack import weight_differences

from services.jobdb import checkpoints

# Long enough to be mid-run when the signal lands (a step takes ~2 ms), with checkpoints
# rare enough that the stop step is rarely one of them.
SPEC = {"max_steps": 1500, "checkpoint_every": 97, "keep_checkpoints": 2}
MAX_EXIT_S = 15.0  # generous for a loaded machine; without the hand-back it is the whole job


@pytest.mark.parametrize("pool", ["solo", "prefork"])
@pytest.mark.slow
def test_sigterm_hands_the_job_back_checkpointed_where_it_stopped(
    stack: Any, tmp_path: Path, record_figure: Any, pool: str
) -> None:
    own = stack.variant(tmp_path)
    first = own.start_worker(pool=pool)
    try:
        job_id = own.create(**SPEC)
        own.wait(job_id, ("running",), check=lambda job: job.progress.get("optimizer_step", 0) > 0)
        sent = time.monotonic()
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
        exit_s = time.monotonic() - sent
        assert first.returncode == 0, own.worker_logs()

        handed_back = own.job(job_id)
        stop_step = handed_back.resume_step
        with own.sessions() as session:
            listed = [c.step for c in checkpoints.list_checkpoints(session, job_id)]
        logged = [step for step, _ in own.metric_steps(job_id)]
        problems_at_stop = own.checkpoint_problems(job_id)

        own.start_worker()
        reference_id = own.create(**SPEC)
        job = own.wait(job_id, timeout=120)
        reference = own.wait(reference_id, timeout=120)
    finally:
        own.stop_workers()
    kinds = own.event_kinds(job_id)
    steps = own.metric_steps(job_id)
    differing = weight_differences(own.final_weights(job_id), own.final_weights(reference_id))
    problems = own.checkpoint_problems(job_id)
    suffix = "" if pool == "solo" else f"_{pool}"
    record_figure(
        f"worker_sigterm_{stack.name}{suffix}", area="fault",
        check=f"SIGTERM to a {pool} worker mid-job, another worker resumes ({stack.name})",
        figure=f"worker exited {exit_s:.1f} s after SIGTERM, job handed back at step {stop_step} "
               f"of {SPEC['max_steps']} with its checkpoint, resumed to "
               f"{'identical' if not differing else 'DIFFERENT'} weights, "
               f"{job.restarts} restarts counted, {len(problems)} checkpoint file problems",
        passed=(job.status == "succeeded" and not differing and exit_s < MAX_EXIT_S
                and not problems),
    )

    # Handed back, not finished: queued, checkpointed at the last step it logged.
    assert handed_back.status == "queued", (handed_back.status, own.worker_logs())
    assert stop_step is not None and 0 < stop_step < SPEC["max_steps"], stop_step
    assert listed[-1] == stop_step and logged == list(range(1, stop_step + 1)), (listed, logged)
    assert not problems_at_stop, problems_at_stop
    assert exit_s < MAX_EXIT_S, f"worker took {exit_s:.1f}s to exit after SIGTERM"

    assert job.status == "succeeded", (job.error, own.worker_logs())
    assert reference.status == "succeeded", reference.error
    assert job.attempts == 2 and job.restarts == 0, (job.attempts, job.restarts)
    assert "lease_expired" not in kinds and kinds.count("requeued") == 1, kinds
    assert steps == [(s, 1 if s <= stop_step else 2) for s in range(1, SPEC["max_steps"] + 1)]
    assert own.metric_steps_by_name(job_id) == own.metric_steps_by_name(reference_id)
    assert not differing, f"parameters {differing} differ from the uninterrupted run"
    assert not problems, problems


def pool_child(worker: Any, timeout_s: float = 30.0) -> int:
    """The pid of the prefork worker's pool child (the process that runs the job)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("the prefork worker has no pool child")


@pytest.mark.slow
def test_sigterm_to_the_pool_child_alone_hands_back_and_the_worker_resumes_it(
    stack: Any, tmp_path: Path, record_figure: Any
) -> None:
    """systemd's default KillMode signals every process of the unit, and an operator may
    `kill` the child: the child must not die mid-job. The job is checkpointed and handed
    back; the worker itself keeps running and resumes it in a new child."""
    own = stack.variant(tmp_path)
    worker = own.start_worker(pool="prefork")
    try:
        job_id = own.create(**SPEC)
        own.wait(job_id, ("running",), check=lambda job: job.progress.get("optimizer_step", 0) > 0)
        child = pool_child(worker)
        os.kill(child, signal.SIGTERM)
        job = own.wait(job_id, timeout=120)
        worker_alive = worker.poll() is None
        reference_id = own.create(**SPEC)
        reference = own.wait(reference_id, timeout=120)
    finally:
        own.stop_workers()
    kinds = own.event_kinds(job_id)
    differing = weight_differences(own.final_weights(job_id), own.final_weights(reference_id))
    problems = own.checkpoint_problems(job_id)
    record_figure(
        f"worker_sigterm_pool_child_{stack.name}", area="fault",
        check=f"SIGTERM to the prefork pool's child only, mid-job ({stack.name})",
        figure=f"job handed back at step {job.resume_step} of {SPEC['max_steps']} "
               f"({kinds.count('requeued')} requeued event), worker still running: "
               f"{worker_alive}, resumed in a new child to "
               f"{'identical' if not differing else 'DIFFERENT'} weights, "
               f"{job.restarts} restarts counted, {len(problems)} checkpoint file problems",
        passed=(job.status == "succeeded" and worker_alive and not differing and not problems
                and job.restarts == 0),
    )

    assert job.status == "succeeded", (job.error, own.worker_logs())
    assert worker_alive, "the worker went down with its pool child"
    assert job.attempts == 2 and job.restarts == 0, (job.attempts, job.restarts, kinds)
    assert "lease_expired" not in kinds and kinds.count("requeued") == 1, kinds
    assert job.resume_step is not None and 0 < job.resume_step < SPEC["max_steps"]
    assert reference.status == "succeeded", reference.error
    assert own.metric_steps_by_name(job_id) == own.metric_steps_by_name(reference_id)
    assert not differing, f"parameters {differing} differ from the uninterrupted run"
    assert not problems, problems
