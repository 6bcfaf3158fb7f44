"""A job's own output captured per attempt (services/worker/output_capture.py): prints, raw
fd writes, warnings, library log records and a spawned child process land in ``job_logs``
tagged with the attempt; the worker's own log records do not; secrets are redacted; lines and
line lengths are bounded and the drops are said; what is captured still reaches the worker's
own stdout/stderr."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from services.jobdb.job_logs import list_lines
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker.log_sink import LineSplitter
from services.worker.output_capture import captured_output


def stored(settings: Settings, job_id: str, attempt: int | None = None) -> list[tuple[int, str, str]]:
    with session_factory(settings)() as session:
        return [(r.attempt, r.stream, r.line) for r in list_lines(session, job_id, attempt=attempt)]


def test_prints_warnings_library_logs_and_child_processes_are_captured_per_attempt(
    settings: Settings, make_job: Callable[..., str], capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_id = make_job()
    secret = "s3cr3t-value-of-the-worker-0123"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    worker_log = logging.getLogger("services.worker.reaper")
    with captured_output(settings, job_id, 1):
        print("hello from the model")
        os.write(2, b"raw bytes on fd 2\n")
        logging.getLogger("somelibrary").warning("library says %d", 42)
        worker_log.warning("the reaper's own line, about another job")
        print(f"the key is {secret}")
        # pytest records warnings raised in its own process: the child shows one as Python does
        subprocess.run([sys.executable, "-c", "import warnings; print('from a child process'); "
                        "warnings.warn('this dataset is tiny')"], check=True)
    with captured_output(settings, job_id, 2):
        print("second attempt")

    first = stored(settings, job_id, attempt=1)
    lines = [line for _, _, line in first]
    assert ("stdout", "hello from the model") in [(s, line) for _, s, line in first]
    assert ("stderr", "raw bytes on fd 2") in [(s, line) for _, s, line in first]
    assert any("UserWarning: this dataset is tiny" in line for line in lines)
    assert "WARNING somelibrary: library says 42" in lines
    assert "from a child process" in lines
    assert "the key is [redacted AWS_SECRET_ACCESS_KEY]" in lines
    assert not any(secret in line for line in lines)
    assert not any("reaper's own line" in line for line in lines)
    assert stored(settings, job_id, attempt=2) == [(2, "stdout", "second attempt")]
    # Teed: the worker's own streams show the job's lines (and its own record) as before.
    out, err = capfd.readouterr()
    assert "hello from the model" in out and "from a child process" in out
    assert "raw bytes on fd 2" in err
    assert "the reaper's own line, about another job" in err  # the operator's only


def test_lines_past_the_bounds_are_cut_or_dropped_and_that_is_said(
    tmp_path: pytest.TempPathFactory, make_job: Callable[..., str], settings: Settings,
) -> None:
    bounded = settings.model_copy(update={"log_max_lines_per_attempt": 5, "log_max_line_bytes": 100})
    job_id = make_job()
    with captured_output(bounded, job_id, 1):
        print("x" * 1000)
        for i in range(20):
            print(f"line {i}")
    lines = [line for _, _, line in stored(settings, job_id)]
    kept = [line for line in lines if not line.startswith("[accum]")]
    assert len(kept) == 5
    assert kept[0].startswith("x" * 100 + " [accum: line cut at 100 bytes")
    assert "it had 1000" in kept[0]
    assert kept[1:] == [f"line {i}" for i in range(4)]
    notes = [line for line in lines if line.startswith("[accum]")]
    assert len(notes) == 2 and "more than 5 lines" in notes[0]
    assert notes[1].startswith("[accum] 16 more lines were dropped")


def test_a_carriage_return_overwrites_the_line_as_a_terminal_does() -> None:
    splitter = LineSplitter(keep=50)
    lines = splitter.feed(b"epoch 1\r 10%\r 50%\r") + splitter.feed(b"\ndone\r\nno newline")
    assert [raw for raw, _ in lines] == [b" 50%", b"done"]
    assert splitter.end() == [(b"no newline", 10)]


def test_a_child_that_outlives_the_attempt_keeps_writing_to_the_operator_only(
    settings: Settings, make_job: Callable[..., str], capfd: pytest.CaptureFixture[str],
) -> None:
    job_id = make_job()
    script = "import time; print('during', flush=True); time.sleep(3); print('after the attempt', flush=True)"
    with captured_output(settings, job_id, 1):
        child = subprocess.Popen([sys.executable, "-c", script])
        time.sleep(1)
    assert child.wait(30) == 0  # its late write found an open pipe (no BrokenPipeError)
    assert [line for _, _, line in stored(settings, job_id)] == ["during"]
    deadline = time.monotonic() + 10
    seen = ""
    while "after the attempt" not in seen and time.monotonic() < deadline:
        seen += capfd.readouterr().out
        time.sleep(0.1)
    assert "after the attempt" in seen
