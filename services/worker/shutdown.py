"""The worker's shutdown request, as the running job sees it.

SIGTERM or SIGINT starts Celery's warm shutdown, which waits for the running task: for a
training job that can be hours, and the supervisor's grace period (``docker stop``,
Kubernetes) ends in SIGKILL, losing every step since the last checkpoint. So ``start_worker``
connects ``request`` to Celery's ``worker_shutting_down`` signal; the job's heartbeat then
answers ``should_stop``, the trainer stops before its next micro-batch, and the worker
checkpoints the last finished window and hands the job back to the queue, where another
worker resumes it exactly (``services.worker.training``, ``runner``).

Under ``--pool prefork`` the signal reaches only the parent: Celery's warm shutdown closes the
pool and waits for the child, never signalling it. So the flag lives in a page of memory
shared with every process forked from this one, and the pool's child sees the parent set it.
"""

from __future__ import annotations

import mmap
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


# Created at import, before ``start_worker`` lets the pool fork, so every child shares it.
requested = SharedFlag()


def request(*_args: Any, **_kwargs: Any) -> None:
    """Receiver of Celery's ``worker_shutting_down`` signal (runs in the signal handler)."""
    requested.set()


def reset(*_args: Any, **_kwargs: Any) -> None:
    """Forget an earlier request (a worker started again in the same process)."""
    requested.clear()
