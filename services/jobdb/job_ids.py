"""Job ids as people type them: the full 26 characters, the 6-character short id that
`accum jobs` and the dashboard show (the id's last SHORT_LEN characters, random, unique among an owner's jobs:
``jobs.create_job`` draws again on a clash), a prefix of it, or a unique prefix of the full id
(git's rule for commit ids; ids start with the time, so older habits such as the first 12
characters keep working)."""

from __future__ import annotations

import re

from sqlalchemy.orm import Session

from services.jobdb import jobs as store_jobs
from services.jobdb.models import Job, Owner
from services.jobdb.types import SHORT_LEN

FULL_ID = re.compile(r"[0-9a-z]{26}")
# Shorter prefixes name weeks of jobs (ids start with the creation time): too many to list.
MIN_PREFIX = 4
PREFIX = re.compile(rf"[0-9a-z]{{{MIN_PREFIX},25}}")
CANDIDATES_SHOWN = 5


class AmbiguousJobId(Exception):
    """A prefix of several jobs' ids; `candidates` holds the newest few of them."""

    def __init__(self, given: str, candidates: list[str]) -> None:
        self.candidates = candidates[:CANDIDATES_SHOWN]
        more = ", ..." if len(candidates) > CANDIDATES_SHOWN else ""
        super().__init__(
            f"job id {given!r} is ambiguous: it starts {', '.join(self.candidates)}{more}; "
            "give more characters"
        )


def find_job(session: Session, given: str, owner: Owner, *, anyones: bool) -> Job | None:
    """The job whose id is `given` or starts with it, among the owner's jobs (with `anyones`,
    among every job); None when there is none. Raises `AmbiguousJobId` for several."""
    text = given.lower()
    if FULL_ID.fullmatch(text):
        job = session.get(Job, text)
    elif PREFIX.fullmatch(text):
        # The short id first; a full id's prefix when no short id starts so.
        ids: list[str] = []
        if len(text) <= SHORT_LEN:  # an admin's own jobs before everyone's
            ids = store_jobs.job_ids_by_short(session, text, owner, limit=CANDIDATES_SHOWN + 1)
            if not ids and anyones:
                ids = store_jobs.job_ids_by_short(session, text, None, limit=CANDIDATES_SHOWN + 1)
        if not ids:
            ids = store_jobs.job_ids_starting_with(
                session, text, owner, anyones=anyones, limit=CANDIDATES_SHOWN + 1
            )
        if len(ids) > 1:
            raise AmbiguousJobId(given, ids)
        job = session.get(Job, ids[0]) if ids else None
    else:
        return None  # no id has this form: no query
    if job is None or (job.owner_id != owner.id and not anyones):
        return None
    return job


def not_found_detail(given: str) -> str:
    """Why no job was found, with the fix."""
    shown = given[:100]
    if PREFIX.fullmatch(given.lower()):
        return f"no job id starts with {shown!r}; list yours with GET /v1/jobs"
    if len(given) < MIN_PREFIX and given.isalnum():
        return (f"job id {shown!r} is too short: give at least {MIN_PREFIX} characters; "
                "list yours with GET /v1/jobs")
    return f"no job {shown!r}; list yours with GET /v1/jobs"
