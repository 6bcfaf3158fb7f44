"""One attempt of a job, as the worker's parts pass it around: ``Attempt`` and its ``Outcome``
(``services.worker.resume`` makes the store and the node ready to resume it).

A leaf of the worker: it imports none of the worker's modules, so the runner, the
single-process training and the DDP ranks all import it without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from services.store.status import JobStatus


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
