"""The live logs stream of `GET /v1/jobs/{id}/logs` with `Accept: text/event-stream`.

Messages: `log` (one captured line, its id as the SSE id, so a reconnecting client continues
with `Last-Event-ID`), then `end` with the job's final status once it is finished and every
line it printed was sent (the worker stores an attempt's last lines before it records the
outcome, so a finished job's lines are all committed when the stream reads it finished).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from services.api.schemas import LogLinePublic
from services.api.sse import sse_message
from services.jobdb.job_logs import list_lines
from services.jobdb.jobs import is_finished, load_job

LINES_PER_POLL = 1000


@dataclass
class LogCursor:
    job_id: str
    attempt: int | None
    after_id: int | None


def poll_logs(session_factory: sessionmaker[Session], cursor: LogCursor) -> tuple[list[bytes], bool]:
    """New lines since the cursor (which moves past them), and whether the stream is over."""
    with session_factory() as session:
        job = load_job(session, cursor.job_id)  # first: finished means its lines are all in
        if job is None:
            return [sse_message("end", {"status": "deleted"})], True
        rows = list_lines(session, cursor.job_id, attempt=cursor.attempt,
                          after_id=cursor.after_id, limit=LINES_PER_POLL)
    out = [sse_message("log", LogLinePublic.model_validate(row), row.id) for row in rows]
    if rows:
        cursor.after_id = rows[-1].id
    if is_finished(job) and len(rows) < LINES_PER_POLL:
        out.append(sse_message("end", {"status": job.status}))
        return out, True
    return out, False
