"""The worker's shutdown request, as the running job sees it.

SIGTERM or SIGINT starts Celery's warm shutdown, which waits for the running task: for a
training job that can be hours, and the supervisor's grace period (``docker stop``,
Kubernetes) ends in SIGKILL, losing every step since the last checkpoint. So ``start_worker``
connects ``request`` to Celery's ``worker_shutting_down`` signal; the job's heartbeat then
answers ``should_stop``, the trainer stops before its next micro-batch, and the worker
checkpoints the last finished window and hands the job back to the queue, where another
worker resumes it exactly (``services.worker.rank``, ``runner``).

Under ``--pool prefork`` the signal reaches only the parent: Celery's warm shutdown closes the
pool and waits for the child, never signalling it. So the flag lives in a page of memory
shared with every process forked from this one, and the pool's child sees the parent set it.

A SIGTERM sent to the pool's child itself (systemd's default KillMode signals every process of
the unit; an operator's ``kill``) would end the job where it stands (billiard's handler exits
the child), losing the steps since the last checkpoint. While a child runs a job,
``stop_job_on_sigterm`` makes that signal a request too, for this process only: the job is
checkpointed and handed back, and the worker, if it is not shutting down, resumes it in a new
child.
"""

from __future__ import annotations

import mmap
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class SharedFlag:
    """A boolean that a process and all its forked children read and write in common (an
    anonymous shared mapping: ``set`` in the parent is ``is_set`` in the child at once).
    Reading it costs one memory access, cheap enough to poll before every micro-batch."""

    def __init__(self) -> None:
        self._page = mmap.mmap(-1, 1, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)

    def set(self) -> None:
        self._page[0] = 1

    def clear(self) -> None:
        self._page[0] = 0

    def is_set(self) -> bool:
        return self._page[0] == 1


class ShutdownRequest:
    """Whether the running job must stop and be handed back: the worker is shutting down (the
    shared flag, set in the parent) or this pool child was sent SIGTERM (``here``)."""

    def __init__(self) -> None:
        self.shared = SharedFlag()
        self.here = False

    def set(self) -> None:
        self.shared.set()

    def clear(self) -> None:
        self.shared.clear()
        self.here = False

    def is_set(self) -> bool:
        return self.here or self.shared.is_set()


# Created at import, before ``start_worker`` lets the pool fork, so every child shares it.
requested = ShutdownRequest()
# Set when this process left a job's training thread behind, hung (``services.worker.pulse.
# run_here``): it takes no other job and ends once that job is recorded (a prefork child after
# its job, as always; a solo worker exits with ``EXIT_ABANDONED``, for its supervisor to start
# a fresh one: ``services.worker.start``).
abandoned = threading.Event()
EXIT_ABANDONED = 75  # EX_TEMPFAIL: a fault of this process's job, not of its configuration
# The worker's own process (``connect``), and whether this process is a prefork child of it.
_worker_pid: int | None = None
in_pool_child = False


def request(*_args: Any, **_kwargs: Any) -> None:
    """Receiver of Celery's ``worker_shutting_down`` signal (runs in the signal handler)."""
    requested.set()


def reset(*_args: Any, **_kwargs: Any) -> None:
    """Forget an earlier request (a worker started again in the same process)."""
    requested.clear()
    abandoned.clear()


def connect(celery_signals: Any) -> None:
    """Wire the request to a worker's Celery signals; call it in the worker's own process,
    before the pool forks (``start_worker``)."""
    global _worker_pid
    reset()
    _worker_pid = os.getpid()
    celery_signals.worker_shutting_down.connect(request, weak=False)
    celery_signals.worker_process_init.connect(mark_pool_child, weak=False)


def mark_pool_child(*_args: Any, **_kwargs: Any) -> None:
    """Receiver of Celery's ``worker_process_init``, which the solo pool sends in the worker's
    own process and a prefork pool in each child it forks."""
    global in_pool_child
    in_pool_child = _worker_pid is not None and os.getpid() != _worker_pid
    requested.here = False


def _stop_here(_signum: int, _frame: Any) -> None:
    requested.here = True


@contextmanager
def stop_job_on_sigterm() -> Iterator[None]:
    """Around a job: in a prefork child, SIGTERM asks the job to stop and be handed back
    instead of ending the process; the child's own handler is back afterwards. Elsewhere (the
    solo pool, tests) nothing changes: the worker's warm shutdown already sets ``requested``."""
    if not in_pool_child:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _stop_here)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
