"""One attempt of a job, as the worker's parts pass it around: ``Attempt``, its ``Outcome``,
and ``prepare_resume`` (the store and the checkpoint directory made ready to resume).

A leaf of the worker: of the worker's modules it imports only ``checkpoints``, so the runner,
the single-process training and the DDP ranks all import it without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from services.store.checkpoints import get_checkpoint, list_checkpoints
from services.store.metrics import delete_metrics_after
from services.store.status import JobStatus, resume_hint
from services.worker.checkpoints import remove_orphans


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


def prepare_resume(sessions: sessionmaker[Session], attempt: Attempt, checkpoint_dir: Path) -> str | None:
    """Drop the metrics a predecessor logged after the checkpoint this attempt resumes from
    (all of them when it starts over) and the checkpoint files no row lists (a predecessor
    killed mid-write left them in ``checkpoint_dir``); returns the checkpoint file to load,
    if any."""
    with sessions.begin() as session:
        delete_metrics_after(session, attempt.job_id, attempt.resume_step)
        remove_orphans(checkpoint_dir, [c.step for c in list_checkpoints(session, attempt.job_id)])
        if attempt.resume_step is None:
            return None
        checkpoint = get_checkpoint(session, attempt.job_id, attempt.resume_step)
        if checkpoint is None:
            raise FileNotFoundError(
                f"job {attempt.job_id} should resume from step {attempt.resume_step} but that "
                f"checkpoint has no record; {resume_hint(attempt.job_id)} again to restart from "
                "the latest one"
            )
        return checkpoint.uri
