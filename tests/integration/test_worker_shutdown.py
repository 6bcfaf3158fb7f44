"""SIGTERM on an idle worker that has already run a job ends the process promptly, so
stopping ``accum up`` / ``make demo`` does not hang (it took 2.5-4 s here, 6-9 s on a loaded
machine: the consumer slept out Celery's 2 s poll, then the interpreter freed torch's objects
one by one)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

# Generous for a loaded 2-core machine; an unfixed worker takes 2.5 s or more.
MAX_EXIT_S = 2.0


def test_idle_worker_that_ran_a_job_exits_promptly_on_sigterm(stack: Any, tmp_path: Path) -> None:
    # A worker of its own, on its own queue, so the job surely runs on the worker we stop.
    own = stack.variant(tmp_path)
    worker = own.start_worker()
    try:
        job = own.wait(own.create(max_steps=2), timeout=90)
        assert job.status == "succeeded", job.error
        time.sleep(0.5)  # idle again, polling for the next message
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        own.stop_workers()
    assert worker.returncode == 0, own.worker_logs()
    assert took < MAX_EXIT_S, f"worker took {took:.2f}s to exit after SIGTERM"
