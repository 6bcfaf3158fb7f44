"""`accum up` starts its worker again when the worker exited because a hung job's training
thread was left in it (``services.worker.shutdown.EXIT_ABANDONED``: the job is recorded and
queued again, docs/architecture.md "One supervisor"); any other exit still ends the service."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.cli.local import Child, LocalService, LocalServiceError
from services.settings import Settings
from services.worker.shutdown import EXIT_ABANDONED


def exited(code: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    process.wait()
    return process


def test_a_worker_that_left_a_hung_job_behind_is_started_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service = LocalService(Settings(home=tmp_path), worker_args=["worker", "--hostname", "w@h"])
    service.children.append(Child("worker", exited(EXIT_ABANDONED), None))
    spawned: list[tuple[str, list[str]]] = []

    def spawn(name: str, args: list[str]) -> None:  # the fresh worker: this one then fails
        spawned.append((name, args))
        service.children.append(Child(name, exited(1), None))

    monkeypatch.setattr(service, "_spawn", spawn)
    with pytest.raises(LocalServiceError, match="the worker process exited with code 1"):
        service.wait()
    assert spawned == [("worker", ["worker", "--hostname", "w@h"])]
