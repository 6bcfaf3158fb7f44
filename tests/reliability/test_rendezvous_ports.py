"""``nodes: 2`` jobs on real worker processes (one gloo CPU rank per node, PostgreSQL + Redis,
checkpoints on S3), their rendezvous ports from a narrow ``ACCUM_RENDEZVOUS_PORTS``. Node 0's
worker serves the store itself, bound as the port is picked (``services.worker.rendezvous``):

- Every port of the range but one held by another program's socket: they are skipped, and the
  job trains with its store on the free one (the port recorded on the attempt).
- Two gangs started at once on a range of two ports: both train, each on a port of its own (a
  port picked by one leader cannot be taken by the other before its store binds it).
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_stack import Stack

from services.jobdb.models import JobAttempt

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("stack", ["postgres_redis"], indirect=True)]

SPEC: dict[str, Any] = {"micro_batch_size": 16, "max_steps": 10, "checkpoint_every": 5,
                        "keep_checkpoints": 1, "accumulation_steps": 2, "gpus": 1, "nodes": 2}
NODE_ENV = {"ACCUM_GANG_FORM_TIMEOUT_S": "30", "ACCUM_COLLECTIVE_TIMEOUT_S": "30",
            "ACCUM_ADVERTISE_ADDRESS": "127.0.0.1"}


def port_block(size: int) -> int:
    """The first of ``size`` consecutive ports, each of them free now, above the kernel's
    ephemeral range (``ip_local_port_range``) where no other program's outgoing connection or
    ``bind(port 0)`` lands on one between this check and the worker's bind."""
    high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[1])
    candidates = list(range(high + 1, 65536 - size)) or list(range(20000, 32768 - size))
    for low in random.sample(candidates, min(len(candidates), 200)):
        try:
            with contextlib.ExitStack() as sockets:
                for port in range(low, low + size):
                    sockets.enter_context(socket.socket()).bind(("", port))
            return low
        except OSError:
            continue
    raise AssertionError(f"no {size} consecutive free ports outside the ephemeral range")


@contextlib.contextmanager
def held(ports: list[int]) -> Iterator[None]:
    """Another program listening on ``ports`` (every interface, as a TCPStore binds)."""
    with contextlib.ExitStack() as sockets:
        for port in ports:
            sock = sockets.enter_context(socket.socket())
            sock.bind(("", port))
            sock.listen()
        yield


def nodes(stack: Stack, tmp_path: Path, s3_url: str, count: int, ports: str) -> Stack:
    own = stack.variant(tmp_path, artifacts_url=s3_url, lease_timeout_s=10.0, heartbeat_interval_s=0.5)
    for i in range(count):
        home = tmp_path / f"node{i}"
        own.start_worker(ACCUM_HOME=str(home), ACCUM_CACHE_DIR=str(home / "cache"),
                         ACCUM_RENDEZVOUS_PORTS=ports, **NODE_ENV)
    return own


def recorded_port(own: Stack, job_id: str) -> int | None:
    with own.sessions() as session:
        return session.query(JobAttempt).filter_by(job_id=job_id, attempt=1).one().master_port


def test_ports_another_program_holds_are_skipped(stack: Stack, tmp_path: Path, s3_url: str) -> None:
    low = port_block(4)
    with held([low, low + 1, low + 2]):
        own = nodes(stack, tmp_path, s3_url, 2, f"{low}-{low + 3}")
        try:
            job_id = own.create(**SPEC)
            job = own.wait(job_id, timeout=240)
            assert job.status == "succeeded", (job.error, own.worker_logs())
            assert job.attempts == 1
            assert recorded_port(own, job_id) == low + 3
        finally:
            own.stop_workers()


def test_two_gangs_started_at_once_on_two_ports_both_train(stack: Stack, tmp_path: Path, s3_url: str) -> None:
    low = port_block(2)
    own = nodes(stack, tmp_path, s3_url, 4, f"{low}-{low + 1}")
    try:
        job_ids = [own.create(**SPEC) for _ in range(2)]
        jobs = [own.wait(job_id, timeout=300) for job_id in job_ids]
        assert [j.status for j in jobs] == ["succeeded"] * 2, ([j.error for j in jobs], own.worker_logs())
        assert [j.attempts for j in jobs] == [1, 1]  # no attempt lost to a collision
        assert sorted(recorded_port(own, job_id) or 0 for job_id in job_ids) == [low, low + 1]
    finally:
        own.stop_workers()
