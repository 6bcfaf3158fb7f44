"""``nodes: 2`` jobs on two real worker processes as two nodes: each its own ACCUM_HOME and cache,
no shared disk, checkpoints on S3 (moto in server mode), PostgreSQL + Redis, one gloo CPU rank
per node, every node advertising 127.0.0.1.

- A ``nodes: 2, N: 2`` job succeeds and its final weights equal, to float32 round-off, the
  same job on one process with ``N: 4`` (the same global windows: the world-invariant order).
- Node 1's worker SIGKILLed mid-job with ``min_nodes: 1``: node 0's rank loses its peer, the
  attempt ends (``node_lost``), the job resumes from its last checkpoint on the survivor alone
  (``world_changed``: 2 -> 1 nodes, N doubled by the fixed window), succeeds with every loss
  step once, and its final weights match the uninterrupted run to float32 round-off. The lost
  node is a restart: the attempt closes ``node_lost`` and ``restarts`` counts it. Under the
  production timings (ACCUM_GANG_FORM_TIMEOUT_S 120, heartbeats every 2 s, 60 s leases) it
  trains again within 15 s of the kill (issue 40: was the full gang-form timeout, 122-128 s):
  the survivor's gang starts as soon as the dead worker's registry row is stale.
- A ``nodes: 2`` job whose gang cannot form (the other worker trains a held job) holds no
  worker: another owner's short job submitted after it starts on the idle worker within 10 s
  (issue 40: waited 3 min 45 s behind the gang's 120 s timeouts), and the gang job forms and
  succeeds once the held job ends.
- The same loss with ``max_restarts: 0``: the job fails at once with a ``NodeLost`` error that
  says max_restarts was reached and why (no endless hand-backs).
- Node 0's worker SIGKILLed (the leader: its worker serves the rendezvous store and holds
  the job's lease): node 1's rank loses its peer and ends; node 1's worker sees node 0's lease
  and registry row unrenewed for three beats and its store refusing connections, ends the
  lease (``leader_lost``) and re-queues the job as the reaper would (a restart counted, the
  lost attempt closed ``lost``), and it resumes from its last checkpoint on the survivor, now
  node 0 of a gang of one, with the uninterrupted run's final weights and every loss step
  once; under the production timings, training again within 15 s of the kill (was 186 s:
  the lease timeout, then the gang-form timeout).
- Node 1's rank hung (SIGSTOP): node 0's collective times out after ACCUM_COLLECTIVE_TIMEOUT_S,
  the attempt ends on both nodes (node 1 ends its stuck rank once the job moved on), and the
  job resumes and succeeds. Node 0's rank hung (the leader's: nothing on node 0 times out):
  node 1's collective fails, and node 0's worker sees its rank's beats stop
  (``services.worker.pulse``) and ends the attempt ``hung``, naming node 0's rank (node 1's
  hung rank is a lost peer to node 0: ``node_lost``). Both within the collective timeout + 10 s.

The faulted jobs are 40 steps (were 2,000 and 4,000): each is held after step 12, both nodes'
ranks waiting at a test-only gate (tests/held_jobs.py, the digits through a plugin the test
owns), until the node is killed or its rank stopped; then the gate opens. So every fault lands
mid-job, past the checkpoint at step 10, deterministically rather than by length, and the job
still trains 28 steps afterwards: what is asserted of the resumed job (every step's loss once,
the single-process weights, the world change, the attempts' outcomes) is as before. The length
had been a guard against a fault that seemed to land after the end; that was watch_ranks' race
(3aa0656), fixed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from held_jobs import Hold, plugin_on_path
from sqlalchemy import func, select
from worker_stack import Stack

from services.jobdb.events import list_events
from services.jobdb.gangs import members_of
from services.jobdb.models import FormingGang, Job, JobAttempt, Metric
from services.jobdb.types import utcnow

from .gang_nodes import (
    COLLECTIVE_TIMEOUT_S,
    HELD_DATASET,
    ROUND_OFF,
    held_on_both_nodes,
    kill_held_node,
    kill_node,
    largest_difference,
    node_workers,
    single_process_reference,
    start_nodes,
    two_nodes,
)

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("stack", ["postgres_redis"], indirect=True)]

STEPS = 40
SPEC: dict[str, Any] = {"micro_batch_size": 16, "max_steps": STEPS, "checkpoint_every": 5,
                        "keep_checkpoints": 2, "max_restarts": 3}
# Jobs whose node is stopped or killed mid-job: the same, held after step 12 until it happens.
LOSS_SPEC = {**SPEC, "dataset": HELD_DATASET}
HANG_SLACK_S = 10  # issue 40: within the collective timeout + 10 s
# The production timings where a bound depends on them (issue 40's "within 15 s" of a lost
# node): the gang-form timeout that must not be what the survivors wait for, the heartbeat
# that says which workers are alive.
PRODUCTION_LEASES = {"lease_timeout_s": 60.0, "heartbeat_interval_s": 2.0, "reaper_interval_s": 10.0}
PRODUCTION_GANG = {"ACCUM_GANG_FORM_TIMEOUT_S": "120"}
REFORM_BOUND_S = 15  # issue 40: a node lost -> training again within 15 s when min_nodes are free
SHORT_JOB_BOUND_S = 10  # issue 40: the starvation case's short job starts within 10 s


def first_step_of(own: Stack, job_id: str, attempt: int) -> Any:
    """When ``attempt`` recorded its first metric (its ranks trained a step), or None."""
    with own.sessions() as session:
        return session.scalar(select(func.min(Metric.ts)).where(
            Metric.job_id == job_id, Metric.attempt >= attempt))


def test_a_two_node_job_trains_the_single_process_trajectory(stack: Stack, tmp_path: Path, s3_url: str) -> None:
    own = two_nodes(stack, tmp_path, s3_url)
    try:
        reference = single_process_reference(own, SPEC)
        job_id = own.create(**SPEC, accumulation_steps=2, gpus=1, nodes=2)
        job = own.wait(job_id, timeout=180)
        assert job.status == "succeeded", (job.error, own.worker_logs())
        with own.sessions() as session:
            members = members_of(session, job_id, job.attempts)
        assert [m.node_rank for m in members] == [0, 1] and len({m.worker for m in members}) == 2
        weights = own.final_weights(job_id)
        difference = largest_difference(weights, reference)
        assert difference <= ROUND_OFF, difference
        assert [s for s, _ in own.metric_steps(job_id)] == list(range(1, STEPS + 1))
        assert own.checkpoint_problems(job_id) == []
    finally:
        own.stop_workers()


def test_a_lost_node_resumes_on_the_survivor(
    stack: Stack, tmp_path: Path, s3_url: str, record_figure: Callable[..., None],
) -> None:
    hold = Hold(tmp_path / "gate")
    own = start_nodes(stack.variant(tmp_path, artifacts_url=s3_url, **PRODUCTION_LEASES), tmp_path,
                      {**PRODUCTION_GANG, **hold.env()})
    try:
        with plugin_on_path():
            reference = single_process_reference(own, LOSS_SPEC)
        job_id = hold.create(own, **LOSS_SPEC, accumulation_steps=2, gpus=1, nodes=2, min_nodes=1)
        held = held_on_both_nodes(own, hold, job_id)
        killed_at = utcnow()
        kill_node(own, held, node_rank=1)
        hold.release()
        job = own.wait(job_id, timeout=300)
        assert job.status == "succeeded", (job.error, own.worker_logs())
        resumed_s = (first_step_of(own, job_id, held.attempts + 1) - killed_at).total_seconds()
        record_figure(
            "multi_node_lost_follower_reform", area="fault",
            check="nodes: 2, min_nodes: 1 job, node 1's worker SIGKILLed mid-job, "
                  "ACCUM_GANG_FORM_TIMEOUT_S=120, heartbeats every 2 s",
            figure=f"the survivor trained its next step {resumed_s:.1f} s after the kill "
                   f"(bound {REFORM_BOUND_S} s; 129.5 s before: the gang-form timeout)",
            passed=resumed_s <= REFORM_BOUND_S,
        )
        assert resumed_s <= REFORM_BOUND_S, (resumed_s, own.worker_logs())
        kinds = own.event_kinds(job_id)
        assert "node_lost" in kinds and "world_changed" in kinds, kinds
        assert job.attempts >= 2 and job.restarts >= 1  # a lost node is a restart, counted
        with own.sessions() as session:
            assert len(members_of(session, job_id, job.attempts)) == 1  # the survivor alone
            first = session.query(JobAttempt).filter_by(job_id=job_id, attempt=1).one()
        assert first.outcome == "node_lost" and first.ended_at is not None
        assert [s for s, _ in own.metric_steps(job_id)] == list(range(1, STEPS + 1))  # each once
        difference = largest_difference(own.final_weights(job_id), reference)
        assert difference <= ROUND_OFF, difference
        assert own.checkpoint_problems(job_id) == []
    finally:
        hold.release()
        own.stop_workers()


def test_a_gang_that_cannot_form_holds_no_worker(
    stack: Stack, tmp_path: Path, s3_url: str, record_figure: Callable[..., None],
) -> None:
    hold = Hold(tmp_path / "gate")
    own = two_nodes(stack, tmp_path, s3_url, **PRODUCTION_GANG, **hold.env())
    try:
        # One worker busy: a one-node job held at its gate after step 1.
        busy = hold.create(own, **{**SPEC, "max_steps": 2, "checkpoint_every": 100},
                           dataset=Hold.dataset(1, micro_batches=1), accumulation_steps=1)
        hold.wait_held(own, busy, processes=1, step=1)
        gang = own.create(**{**SPEC, "max_steps": 4}, accumulation_steps=2, gpus=1, nodes=2)

        def taken(job: Job) -> bool:  # the idle worker took its message
            with own.sessions() as session:
                return bool(session.scalar(select(FormingGang.job_id).where(FormingGang.job_id == gang))
                            or "gang_waiting" in own.event_kinds(gang))

        own.wait(gang, ("queued",), timeout=60, check=taken)
        own.owner = None  # another owner's few-step job, submitted behind the gang job
        short = own.create(max_steps=2, checkpoint_every=100)
        submitted = own.job(short).created_at
        started = own.wait(short, ("running", "succeeded"), timeout=300)
        assert started.started_at is not None
        waited_s = (started.started_at - submitted).total_seconds()
        assert own.wait(short).status == "succeeded"
        hold.release()
        freed = utcnow()
        done = own.wait(gang, timeout=180)
        assert done.status == "succeeded", (done.error, own.worker_logs())
        assert done.started_at is not None
        gang_s = (done.started_at - freed).total_seconds()
        record_figure(
            "gang_waiting_holds_no_worker", area="fault",
            check="two workers, one training a held job; a nodes: 2 job, then another owner's "
                  "2-step job; ACCUM_GANG_FORM_TIMEOUT_S=120",
            figure=f"the short job started {waited_s:.1f} s after its submit (bound "
                   f"{SHORT_JOB_BOUND_S} s; 240.7 s before); the gang formed {gang_s:.1f} s after "
                   "the held job was let go, and succeeded",
            passed=waited_s <= SHORT_JOB_BOUND_S,
        )
        assert waited_s <= SHORT_JOB_BOUND_S, (waited_s, own.worker_logs())
        assert "gang_waiting" in own.event_kinds(gang)
    finally:
        hold.release()
        own.stop_workers()


def test_a_job_that_keeps_losing_nodes_fails_once_max_restarts_is_reached(
    stack: Stack, tmp_path: Path, s3_url: str,
) -> None:
    hold = Hold(tmp_path / "gate")
    own = two_nodes(stack, tmp_path, s3_url, **hold.env())
    try:
        job_id = hold.create(own, **{**LOSS_SPEC, "max_restarts": 0}, accumulation_steps=2, gpus=1, nodes=2,
                             min_nodes=1)
        kill_held_node(own, hold, job_id, node_rank=1, checkpoint=None)
        job = own.wait(job_id, timeout=120)
        assert job.status == "failed", (job.status, own.worker_logs())
        assert job.error is not None and job.error["type"] == "NodeLost", job.error
        assert job.error["reason"] == "max_restarts" and "max_restarts reached" in job.error["message"]
        assert "node 0 of 2" in job.error["message"], job.error  # which node saw the loss
        assert job.restarts == 0 and job.attempts == 1
        assert own.event_kinds(job_id).count("node_lost") == 1
        with own.sessions() as session:
            only = session.query(JobAttempt).filter_by(job_id=job_id).one()
        assert only.outcome == "failed" and only.ended_at is not None
    finally:
        hold.release()
        own.stop_workers()


def test_losing_node_0_resumes_on_the_survivor(
    stack: Stack, tmp_path: Path, s3_url: str, record_figure: Callable[..., None],
) -> None:
    hold = Hold(tmp_path / "gate")
    own = start_nodes(stack.variant(tmp_path, artifacts_url=s3_url, **PRODUCTION_LEASES), tmp_path,
                      {**PRODUCTION_GANG, **hold.env()})
    try:
        with plugin_on_path():
            reference = single_process_reference(own, LOSS_SPEC)
        job_id = hold.create(own, **LOSS_SPEC, accumulation_steps=2, gpus=1, nodes=2, min_nodes=1)
        held = held_on_both_nodes(own, hold, job_id)
        killed_at = utcnow()
        first = kill_node(own, held, node_rank=0)  # the store's host, the lease holder
        hold.release()
        job = own.wait(job_id, timeout=300)
        assert job.status == "succeeded", (job.error, own.worker_logs())
        resumed_s = (first_step_of(own, job_id, held.attempts + 1) - killed_at).total_seconds()
        record_figure(
            "multi_node_lost_leader_reform", area="fault",
            check="nodes: 2, min_nodes: 1 job, node 0's worker (lease holder, rendezvous store) "
                  "SIGKILLed mid-job, ACCUM_LEASE_TIMEOUT_S=60, ACCUM_GANG_FORM_TIMEOUT_S=120, "
                  "heartbeats every 2 s",
            figure=f"the survivor trained its next step {resumed_s:.1f} s after the kill "
                   f"(bound {REFORM_BOUND_S} s; 188.2 s before: the lease "
                   f"timeout, then the gang-form timeout)",
            passed=resumed_s <= REFORM_BOUND_S,
        )
        assert resumed_s <= REFORM_BOUND_S, (resumed_s, own.worker_logs())
        assert job.restarts == 1 and job.attempts >= 2, (job.restarts, job.attempts)
        kinds = own.event_kinds(job_id)
        assert {"leader_lost", "lease_expired", "world_changed"} <= set(kinds), kinds
        with own.sessions() as session:
            last = members_of(session, job_id, job.attempts)
            attempts = session.query(JobAttempt).filter_by(job_id=job_id).order_by(JobAttempt.attempt).all()
        assert [m.worker for m in last] == [first[1]]  # the survivor, now node 0 of one
        outcomes = [a.outcome for a in attempts]
        assert outcomes[0] == "lost" and outcomes[-1] == "succeeded", outcomes
        assert all(a.ended_at is not None for a in attempts), outcomes
        assert [s for s, _ in own.metric_steps(job_id)] == list(range(1, STEPS + 1))  # each once
        difference = largest_difference(own.final_weights(job_id), reference)
        assert difference <= ROUND_OFF, difference
        assert own.checkpoint_problems(job_id) == []
    finally:
        hold.release()
        own.stop_workers()


def rank_processes(worker_pid: int) -> list[int]:
    """The spawned rank processes of a worker (its children running multiprocessing's
    ``spawn_main``, not its resource tracker)."""
    ranks = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == worker_pid and b"spawn_main" in cmdline:
            ranks.append(int(stat.parent.name))
    return ranks


@pytest.mark.parametrize("node_rank", [1, 0], ids=["follower", "leader"])
def test_a_hung_rank_ends_the_attempt_within_the_collective_timeout(
    stack: Stack, tmp_path: Path, s3_url: str, record_figure: Callable[..., None], node_rank: int,
) -> None:
    hold = Hold(tmp_path / "gate")
    own = two_nodes(stack, tmp_path, s3_url, **hold.env())
    hung: list[int] = []
    try:
        # Held after step 12 until the rank is stopped: mid-job however late progress is read.
        job_id = hold.create(own, **LOSS_SPEC, accumulation_steps=2, gpus=1, nodes=2, min_nodes=1)
        victim = node_workers(own, held_on_both_nodes(own, hold, job_id, checkpoint=None))[node_rank]
        hung = rank_processes(own.hostnames[victim].pid)
        assert len(hung) == 1 and hung[0] in hold.held(), (hung, hold.held())
        os.kill(hung[0], signal.SIGSTOP)
        stopped_at = time.monotonic()
        hold.release()  # the other node's rank trains on into the collective its stopped peer never joins
        cause = "hung" if node_rank == 0 else "node_lost"  # node 0's own rank, or its lost peer
        own.wait(job_id, ("queued", "running", "succeeded", "failed"), timeout=120,
                 check=lambda j: cause in own.event_kinds(job_id))
        noticed_s = time.monotonic() - stopped_at
        job = own.wait(job_id, timeout=300)
        steps = [s for s, _ in own.metric_steps(job_id)]
        # Node 1 stopped: node 0's collective times out (ACCUM_COLLECTIVE_TIMEOUT_S). Node 0
        # stopped (the leader: the lease holder, nothing times out there): its worker sees its
        # rank's beats stop (services.worker.pulse: the collective timeout + 5 s after the last).
        held = noticed_s <= COLLECTIVE_TIMEOUT_S + HANG_SLACK_S and job.status == "succeeded"
        record_figure(
            "multi_node_hung_rank" if node_rank else "multi_node_hung_leader_rank", area="fault",
            check=f"nodes: 2 job, node {node_rank}'s rank SIGSTOPped mid-job, "
                  f"ACCUM_COLLECTIVE_TIMEOUT_S={COLLECTIVE_TIMEOUT_S}",
            figure=f"attempt ended {noticed_s:.1f} s after the SIGSTOP; job {job.status}, "
                   f"{len(steps)}/{STEPS} loss steps, each once",
            passed=held and steps == list(range(1, STEPS + 1)),
        )
        assert noticed_s <= COLLECTIVE_TIMEOUT_S + HANG_SLACK_S, noticed_s
        assert job.status == "succeeded", (job.error, own.worker_logs())
        assert steps == list(range(1, STEPS + 1))
        with own.sessions() as session:
            first = session.query(JobAttempt).filter_by(job_id=job_id, attempt=1).one()
            lost = [e.message for e in list_events(session, job_id, limit=1000) if e.kind == cause]
        assert first.outcome == cause and first.ended_at is not None
        if node_rank == 0:  # its own worker named it
            assert lost[0].startswith(f"node 0 of 2: rank 0 (pid {hung[0]},"), lost
    finally:
        hold.release()
        for pid in hung:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        own.stop_workers()
