"""Ctrl-C as KeyboardInterrupt, even where the shell started us with SIGINT ignored.

A shell without job control starts `cmd &` (a script, a CI job) with SIGINT ignored, and
Python then installs no handler: Ctrl-C, or `kill -INT`, would do nothing. The CLI's ``main``
takes it back for every command (`accum up`, `demo`, `watch`, `logs --follow`, ...).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def sigint_interrupts() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt inside the block (the main thread only: elsewhere
    Python cannot set a handler, and the block runs as it is); the previous disposition after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
