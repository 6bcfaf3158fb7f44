"""One attempt of a job, as the worker's parts pass it around: ``Attempt`` and its ``Outcome``
(``services.worker.checkpoints.resume`` makes the store and the node ready to resume it).

A leaf of the worker: it imports none of the worker's modules, so the runner, the
single-process training and the DDP ranks all import it without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from services.jobdb.leases import HUNG, Fault
from services.jobdb.status import JobStatus


class Outcome(StrEnum):
    """How an attempt ended, as ``train`` and ``run_job`` report it.

    The first three are the statuses ``run_job`` records on the job; the others record nothing
    (the job is someone else's, or back in the queue).
    """

    SUCCEEDED = JobStatus.SUCCEEDED.value
    FAILED = JobStatus.FAILED.value
    CANCELLED = JobStatus.CANCELLED.value
    # The worker is shutting down (SIGTERM): the job was checkpointed where it stopped and
    # goes back to the queue for another worker (``run_job`` enqueues it again).
    HANDED_BACK = "handed_back"
    # The lease expired and was taken (a long database outage, a paused worker): the job
    # belongs to its new owner, and this attempt writes nothing more.
    LEASE_LOST = "lease_lost"
    # The job ran past its ``timeout`` (checkpointed where it stopped): ``run_job`` fails it
    # with reason "timeout".
    TIMED_OUT = "timed_out"
    # The message was dropped: the job was not claimable (cancelled, finished, or running
    # under a live lease elsewhere), so nothing ran.
    SKIPPED = "skipped"
    # A node other than node 0 of a multi-node job: its ranks trained (or stopped with the
    # others); node 0 holds the lease and records the job.
    FOLLOWED = "followed"


class NodeLost(RuntimeError):
    """A rank of a multi-node attempt lost its peers (a node died, a collective timed out): the
    attempt ends on every node and the job resumes from its last checkpoint. ``fault``: the
    cause it is recorded with where not ``leases.NODE_LOST`` (``runner.run_job``)."""

    fault: Fault | None = None


class RankHung(NodeLost):
    """A rank made no progress past its deadline (``services.worker.pulse``), or its peers
    failed waiting for it while it was silent: its supervisor ended every rank of the attempt
    on its node (a world of 1: left its thread behind), and the job resumes from its last
    checkpoint as after a lost node (a restart counted), the attempt closed ``hung``."""

    fault = HUNG


@dataclass(frozen=True)
class Attempt:
    """The claimed attempt: who runs it and where it starts."""

    job_id: str
    attempt: int
    worker_id: str
    resume_step: int | None
    spec: dict[str, Any]
    # Seconds the job's earlier attempts ran since submit or the last resume: this attempt
    # runs for what is left of the spec's ``timeout``.
    used_s: float = 0.0
    # (m, N) that ``micro_batch_size: "auto"`` chose at the job's first attempt, read from the
    # job row at the claim (``services.worker.micro_batch``); None until one chose.
    micro_batch: tuple[int, int] | None = None
    # The job's owner's name: the data roots it may read (services.data_roots), checked again
    # on every node before anything is read. None: everyone's roots only.
    owner: str | None = None


class Flags(Protocol):
    """What ends an attempt early: the heartbeat's flags (``services.worker.heartbeat``)."""

    @property
    def lease_lost(self) -> bool: ...
    @property
    def cancel_requested(self) -> bool: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def shutting_down(self) -> bool: ...


def outcome(stopped: bool, flags: Flags) -> Outcome:
    """How a ``fit`` that returned ended: stopped by a cancel, a shutdown or a lost lease, or
    run to its end."""
    if flags.lease_lost:
        return Outcome.LEASE_LOST
    if stopped and not flags.cancel_requested and flags.timed_out:
        return Outcome.TIMED_OUT
    if stopped and not flags.cancel_requested and flags.shutting_down:
        return Outcome.HANDED_BACK
    if stopped:
        return Outcome.CANCELLED
    return Outcome.SUCCEEDED
