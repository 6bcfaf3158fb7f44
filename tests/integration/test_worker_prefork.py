"""The optional prefork pool (``python -m services.worker --pool prefork``): a job runs to
success in the pool's fresh child, on both stacks. A child forked from a parent whose reaper
thread holds database and broker connections must build its own, not hang on inherited ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_prefork_worker_runs_a_job_to_success(stack: Any, tmp_path: Path) -> None:
    own = stack.variant(tmp_path)
    own.start_worker(pool="prefork")
    try:
        first = own.wait(own.create(max_steps=4), timeout=60)
        # worker_max_tasks_per_child=1: the second job runs in a second, fresh child.
        second = own.wait(own.create(max_steps=4), timeout=60)
    finally:
        own.stop_workers()
    assert first.status == "succeeded", (first.error, own.worker_logs())
    assert second.status == "succeeded", (second.error, own.worker_logs())
