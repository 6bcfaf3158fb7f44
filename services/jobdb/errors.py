"""Errors the store raises for requests that cannot be honoured; the API maps them to 4xx."""

from __future__ import annotations


class StoreError(Exception):
    """Base class: the message says what was wrong and how to fix it."""


class IdempotencyConflict(StoreError):
    """The idempotency key was already used with a different spec (HTTP 409)."""

    def __init__(self, key: str, job_id: str) -> None:
        self.key, self.job_id = key, job_id
        super().__init__(
            f"Idempotency-Key {key!r} was already used for job {job_id} with a different body; "
            "send the same body to get that job back, or use a new key"
        )


class JobStateError(StoreError):
    """The job is in a state where the action is not allowed (HTTP 409)."""

    def __init__(self, job_id: str, status: str, action: str, allowed: tuple[str, ...]) -> None:
        self.job_id, self.status, self.action, self.allowed = job_id, status, action, allowed
        super().__init__(
            f"cannot {action} job {job_id}: it is {status}; {action} needs a job that is "
            f"{' or '.join(allowed)}"
        )


class InvalidCursor(StoreError, ValueError):
    """A pagination cursor that this store did not produce (HTTP 400/422)."""

    def __init__(self, cursor: str) -> None:
        self.cursor = cursor
        super().__init__(
            f"invalid cursor {cursor!r}: pass the next_cursor value of the previous page unchanged"
        )


class ActiveJobCapReached(StoreError):
    """The owner already has as many unfinished jobs as ACCUM_MAX_ACTIVE_JOBS_PER_OWNER (429)."""

    def __init__(self, cap: int, active: int) -> None:
        self.cap, self.active = cap, active
        super().__init__(
            f"you have {active} queued or running jobs and the limit per owner is {cap}; wait "
            "for some to finish or cancel some (`accum jobs`, `accum cancel ID`), then submit again"
        )
