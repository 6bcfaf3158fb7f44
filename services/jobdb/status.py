"""A job's status, defined once: ``JobStatus`` and the sets the store, API and worker test.

    from services.jobdb.status import ACTIVE, FINISHED, JobStatus
    if job.status in FINISHED: ...

Torch- and SQL-free, so the CLI and the dashboard's tests can import it cheaply. A
``JobStatus`` is a ``str``: it compares equal to the stored text, binds as that text in SQL
and serialises as it in JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class JobStatus(StrEnum):
    """``queued -> running -> succeeded | failed | cancelled``; ``running -> cancelling ->
    cancelled``; ``POST /resume`` moves ``failed | cancelled -> queued``."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Every status, as a set: ``"x" in JobStatus`` raises TypeError before Python 3.12.
ALL = frozenset(JobStatus)
# A worker holds the lease.
ACTIVE = frozenset({JobStatus.RUNNING, JobStatus.CANCELLING})
# Nothing more happens to the job unless a user resumes it.
FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
# Counted against an owner's cap on unfinished jobs.
UNFINISHED = frozenset({JobStatus.QUEUED}) | ACTIVE


def resume_hint(job_id: str) -> str:
    """How a user continues a failed or cancelled job, in every message that says so (the CLI
    shows it as ``accum resume <id>``: ``services.cli.common.in_cli_words``)."""
    return f"POST /v1/jobs/{job_id}/resume"


def ordered(statuses: Iterable[str]) -> tuple[JobStatus, ...]:
    """``statuses`` in lifecycle order (for messages that list them, and stable SQL)."""
    wanted = set(statuses)
    return tuple(status for status in JobStatus if status in wanted)
