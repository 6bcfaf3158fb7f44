"""A child process that dies with the worker that started it (a rank, the tracker host).

Torch-free: the tracker host (``services.worker.trackers.host``) imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the thread that started it dies (the worker
    process killed), instead of running on, orphaned, for a job that has moved on."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
