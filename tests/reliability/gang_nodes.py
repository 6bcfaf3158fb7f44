"""Two worker processes as two nodes of one queue, for the multi-node tests (DDP and FSDP):
each its own ACCUM_HOME and cache (no shared disk), short leases and gang formation, a
collective timeout that notices a dead peer within a test, every node advertising 127.0.0.1."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from held_jobs import Hold
from worker_stack import Stack

from services.jobdb.gangs import members_of
from services.jobdb.models import Job

LEASES = {"lease_timeout_s": 5.0, "heartbeat_interval_s": 0.5, "reaper_interval_s": 0.5}
COLLECTIVE_TIMEOUT_S = 20
NODE_ENV = {"ACCUM_GANG_FORM_TIMEOUT_S": "4", "ACCUM_COLLECTIVE_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S),
            "ACCUM_ADVERTISE_ADDRESS": "127.0.0.1"}
# float32 round-off: the ranks reduce the gradients in another order than one process.
ROUND_OFF = 1e-5
# A node-loss job is held (tests/held_jobs.py) once step HOLD_STEP is done, past its checkpoint
# at HELD_CHECKPOINT (checkpoint_every 5), until its node is killed or stopped: so the fault
# lands mid-job however late progress is read, with the job still to train afterwards. Each
# node's rank loads N = 2 micro-batches a step.
HOLD_STEP = 12
HELD_CHECKPOINT = 10
HELD_DATASET = Hold.dataset(HOLD_STEP, micro_batches=2)


def two_nodes(stack: Stack, tmp_path: Path, s3_url: str, **env: str) -> Stack:
    """A variant of ``stack`` with checkpoints on S3 and two nodes (node0, node1) started,
    ``env`` set for both (``Hold.env()``; it overrides NODE_ENV)."""
    return start_nodes(stack.variant(tmp_path, artifacts_url=s3_url, **LEASES), tmp_path, env)


def start_nodes(own: Stack, tmp_path: Path, env: dict[str, str]) -> Stack:
    """Start two nodes (node0, node1) on ``own``, with NODE_ENV and ``env`` (overriding it),
    and wait until both consume (registered): a gang job's ``min_nodes`` is met by the free
    workers it finds, so a job submitted while one node still imports torch would start on
    the other alone."""
    started = [own.start_worker(ACCUM_HOME=str(home), ACCUM_CACHE_DIR=str(home / "cache"), **{**NODE_ENV, **env})
               for home in (tmp_path / "node0", tmp_path / "node1")]
    for process in started:
        own.wait_ready(process)
    return own


def largest_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a)


def single_process_reference(own: Stack, spec: dict[str, Any]) -> dict[str, Any]:
    """The final weights of ``spec`` in one process with N = 4: the same global windows as
    N = 2 on two ranks (the world-invariant order)."""
    job_id = own.create(**spec, accumulation_steps=4, gpus=1)
    job = own.wait(job_id, timeout=180)
    assert job.status == "succeeded", (job.error, own.worker_logs())
    return own.final_weights(job_id)


def node_workers(own: Stack, job: Job) -> dict[int, str]:
    """The worker of each node rank of the job's current attempt."""
    with own.sessions() as session:
        return {m.node_rank: m.worker for m in members_of(session, job.id, job.attempts)}


def kill_node(own: Stack, job: Job, node_rank: int) -> dict[int, str]:
    """SIGKILL the worker of node ``node_rank`` (its ranks die with it: PR_SET_PDEATHSIG) and
    wait for it; returns the attempt's workers by node rank, as they were."""
    workers = node_workers(own, job)
    victim = own.hostnames[workers[node_rank]]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    return workers


def held_on_both_nodes(own: Stack, hold: Hold, job_id: str, checkpoint: int | None = HELD_CHECKPOINT) -> Job:
    """The job once both nodes' ranks wait at ``hold``'s gate after step HOLD_STEP (and the
    checkpoint of step ``checkpoint`` is listed)."""
    return hold.wait_held(own, job_id, processes=2, step=HOLD_STEP, checkpoint=checkpoint)


def kill_held_node(own: Stack, hold: Hold, job_id: str, node_rank: int,
                   checkpoint: int | None = HELD_CHECKPOINT) -> dict[int, str]:
    """``kill_node`` once the job is held on both nodes; then the gate opens and the other
    node's rank trains on into its lost peer. Returns the attempt's workers by node rank."""
    workers = kill_node(own, held_on_both_nodes(own, hold, job_id, checkpoint), node_rank)
    hold.release()
    return workers
