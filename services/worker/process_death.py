"""What a worker's main process learns when the prefork child running a job dies.

    JobRequest = request_class(settings)   # the task's Celery ``Request`` (services.worker.tasks)

With ``--pool prefork`` the job runs in a child process; when the kernel kills it (the OOM
killer, a crash in native code) the main process lives on, and Celery reports the child's end
as ``WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 0.")``. The request
class here turns that into a cause ("killed by signal 9 (SIGKILL)"; "out of memory (the
kernel's OOM killer): ..." when the cgroup's ``oom_kill`` counter rose meanwhile), records it
on the attempt with a ``process_died`` event and expires the lease, so the reaper re-queues the
job at once, or fails it as poison naming the cause. With the ``solo`` pool the job dies with
the worker itself: nobody is left to see the cause, and the reaper reports the lost lease and
the job's last event only.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery.worker.request import Request

from services.jobdb.attempts import record_process_death
from services.jobdb.sessions import session_factory
from services.settings import Settings

log = logging.getLogger(__name__)

_PREMATURE = re.compile(r"exited prematurely: (?P<status>.+?)(?: Job: \d+)?\.?$")
_SIGNAL = re.compile(r"signal \d+")


def oom_kills(path: Path) -> int | None:
    """The ``oom_kill`` counter of a cgroup v2 ``memory.events`` file; None when unreadable
    (no cgroup v2, another layout)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def cause_of(exc: BaseException, oom_before: int | None, oom_after: int | None) -> str | None:
    """The cause a ``WorkerLostError`` names, in words: ``killed by signal 9 (SIGKILL)``,
    ``exited with code 1``, prefixed with the OOM killer when the counter rose. None for any
    other exception (the child reported it itself)."""
    if not isinstance(exc, WorkerLostError):
        return None
    match = _PREMATURE.search(str(exc))
    status = match.group("status") if match else str(exc) or "unknown exit"
    if _SIGNAL.match(status):
        cause = f"killed by {status}"
    elif status.startswith("exitcode "):
        cause = f"exited with code {status.removeprefix('exitcode ')}"
    else:
        cause = status
    if oom_before is not None and oom_after is not None and oom_after > oom_before:
        cause = f"out of memory (the kernel's OOM killer): {cause}"
    return cause


def request_class(settings: Settings) -> type[Request]:
    """A Celery ``Request`` for ``accum.run_job`` that records how the job's child died."""

    class JobRequest(Request):
        _oom_before: int | None = None

        def on_accepted(self, pid: int, time_accepted: float) -> Any:
            # A child took the job: the OOM kills counted so far are not this job's.
            self._oom_before = oom_kills(settings.oom_events_file)
            return super().on_accepted(pid, time_accepted)

        def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                       return_ok: bool = False) -> Any:
            try:
                self._record(exc_info.exception)
            except Exception:  # the reaper still handles the lost lease, without the cause
                log.warning("could not record how job %s's process died", self.args, exc_info=True)
            return super().on_failure(exc_info, send_failed_event=send_failed_event,
                                      return_ok=return_ok)

        def _record(self, exc: BaseException) -> None:
            if isinstance(exc, ExceptionWithTraceback):
                exc = exc.exc
            if isinstance(exc, SystemExit) and not (self._already_cancelled or self._already_revoked):
                exc = self._worker_lost_info(exc).exception  # Celery treats it as lost too
            cause = cause_of(exc, self._oom_before, oom_kills(settings.oom_events_file))
            if cause is None or not self.args:
                return
            job_id = str(self.args[0])
            with session_factory(settings).begin() as session:
                attempt = record_process_death(session, job_id, self.hostname, cause)
            log.error("job %s: the process running attempt %s %s", job_id, attempt, cause)

    return JobRequest
