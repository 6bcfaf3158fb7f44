"""`accum watch` at 80 columns: the history in order (attempt by attempt, past evaluations in
their place, checkpoints folded), live evaluations and the outcome, the progress line (ETA,
average samples/s) within the width, and Ctrl-C that leaves the job running and says how to
come back. The job's life is written through the store functions a worker uses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from datetime import timedelta
from typing import Any

import pytest
from cli_helpers import ACCUM, Server, assert_fits
from cli_helpers import accum_in_process as accum
from rich.progress import ProgressSample, Task, TaskID

from accum import AccumClient
from services.cli.watch import HINT_TIMEOUT_S, JobLine, _say_still_running
from services.jobdb.types import utcnow

WAIT_S = 30.0


def evaluation(step: int, loss: float, accuracy: float) -> list[dict[str, Any]]:
    ts = utcnow()
    return [
        {"name": "val_loss", "step": step, "epoch": 0, "value": loss, "ts": ts},
        {"name": "val_accuracy", "step": step, "epoch": 0, "value": accuracy, "ts": ts},
    ]


def checkpoints(seed: Any, job_id: str, steps: range, attempt: int) -> None:
    for step in steps:
        seed.event(job_id, "checkpoint", f"checkpoint at step {step}", {"step": step}, attempt)


def test_a_finished_jobs_history_in_order_attempt_by_attempt(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any],
) -> None:
    job_id = client.submit(tiny_spec)["id"]
    seed.claim(job_id, "w1")
    checkpoints(seed, job_id, range(5, 25, 5), attempt=1)
    seed.rows(job_id, evaluation(23, 0.31, 0.9))
    checkpoints(seed, job_id, range(25, 35, 5), attempt=1)
    seed.checkpoint(job_id, 30, b"weights")
    seed.claim(job_id, "w2", now=utcnow() + timedelta(seconds=120))  # w1's lease ran out
    seed.rows(job_id, evaluation(46, 0.2, 0.95), attempt=2)
    seed.finish(job_id, "w2", "succeeded")

    code, out, _ = accum(capsys, "watch", job_id[:12])

    assert code == 0
    assert_fits(out)
    *history, outcome = out.splitlines()
    assert outcome == f"job {job_id} succeeded"
    assert [line[10:].rstrip() for line in history] == [  # without the time of day
        f"created        job {job_id} queued on 'default'",
        "started        attempt 1 started on host-w1",
        "checkpoint     steps 5, 10, 15, 20",
        "eval           step 23, epoch 1: val_accuracy 0.9, val_loss 0.31",
        "checkpoint     steps 25, 30",
        "lease expired  lease of host-w1 expired; taken over by host-w2",
        "-------------  attempt 2",
        "started        attempt 2 started on host-w2 from checkpoint step 30",
        "eval           step 46, epoch 1: val_accuracy 0.95, val_loss 0.2",
        "succeeded",
    ], out


LONG_ERROR = (
    "step 7: loss is nan; the last checkpoint with finite values is "
    "s3://bucket/prefix/01jd3k5x9a2fexample/5.pt (step 5). Lower the learning rate or clip "
    "gradients (grad_clip_norm)"
)


def test_an_error_is_printed_once_and_wraps_under_its_event(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any],
) -> None:
    job_id = client.submit(tiny_spec)["id"]
    seed.claim(job_id, "w1")
    # What the runner writes for a failed attempt: the traceback, then the outcome.
    seed.event(job_id, "traceback", f"NonFiniteError: {LONG_ERROR}", {"traceback": "..."}, 1)
    seed.finish(job_id, "w1", "failed", {"type": "NonFiniteError", "message": LONG_ERROR})

    code, out, _ = accum(capsys, "watch", job_id[:12])

    assert code == 3
    assert_fits(out)
    assert out.count("step 7: loss is nan") == 1, out
    assert out.rstrip().splitlines()[-1] == f"job {job_id} failed"
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "step 7: loss is nan" in line)
    assert lines[start][10:].startswith("failed         NonFiniteError: step 7")
    wrapped = lines[start + 1 : -1]
    assert wrapped and all(line.startswith(" " * 25) and line[25] != " " for line in wrapped)
    assert "grad_clip_norm" in " ".join(lines[start:-1])


def test_live_evaluations_and_the_outcome_arrive_while_watching(
    cli_env: Server, client: AccumClient, seed: Any, tiny_spec: dict[str, Any]
) -> None:
    job_id = client.submit({**tiny_spec, "epochs": 3})["id"]
    seed.claim(job_id, "w1")
    watcher = start_watch(cli_env, job_id)
    try:
        wait_for(watcher, "started")
        for step in range(1, 4):
            seed.rows(job_id, [{"name": n, "step": step, "epoch": 0, "value": v}
                               for n, v in (("loss", 1.0 / step), ("samples_per_s", 100.0 * step))])
        seed.progress(job_id, 3, {"loss": 1 / 3})
        seed.rows(job_id, evaluation(3, 0.4, 0.8))
        checkpoints(seed, job_id, range(1, 4), attempt=1)
        seed.error = None
        seed.finish(job_id, "w1", "failed", {"type": "NonFiniteError", "message": "loss is NaN at step 4"})
        out, err = watcher.communicate(timeout=WAIT_S)
    finally:
        watcher.kill()
    assert watcher.returncode == 3, err  # failed
    assert_fits(out)
    assert "eval           step 3, epoch 1: val_accuracy 0.8, val_loss 0.4" in out
    assert "checkpoint     steps 1, 2, 3" in out
    assert "failed         NonFiniteError: loss is NaN at step 4" in out
    assert out.count("loss is NaN at step 4") == 1 and out.rstrip().endswith(f"job {job_id} failed")
    # The progress line, as a log gets it: epoch counted from 1, the average samples/s.
    assert "3/69" in out and "epoch 1/3" in out and "loss 0.333333" in out and "200 samples/s" in out


def test_ctrl_c_leaves_the_job_running_and_says_how_to_come_back(
    cli_env: Server, client: AccumClient, tiny_spec: dict[str, Any]
) -> None:
    job_id = client.submit(tiny_spec)["id"]
    watcher = start_watch(cli_env, job_id)
    try:
        wait_for(watcher, "created")
        watcher.send_signal(signal.SIGINT)
        try:
            _, err = watcher.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            watcher.send_signal(signal.SIGABRT)
            pytest.fail(f"the watcher did not exit after Ctrl-C; its threads:\n{watcher.communicate(timeout=WAIT_S)[1]}")
    finally:
        watcher.kill()

    assert watcher.returncode == 130
    assert err.splitlines() == [
        f"stopped watching; job {job_id} is still queued.",
        f"follow it again: accum watch {job_id[-6:]}",
        f"stop it:         accum cancel {job_id[-6:]}",
    ]
    assert client.job(job_id)["status"] == "queued"


def test_ctrl_c_with_a_server_that_does_not_answer_says_what_the_watcher_knew_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The status read after Ctrl-C waits a few seconds (HINT_TIMEOUT_S), not the client's 30."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts connections, never answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    job = {"status": "running", "progress": {"optimizer_step": 7, "total_optimizer_steps": 40}}
    said = threading.Thread(target=_say_still_running, args=(AccumClient(url, "t"), "01jobid", job), daemon=True)
    try:
        said.start()
        said.join(timeout=HINT_TIMEOUT_S * 5)  # the client's own timeout is 30 s
        assert not said.is_alive(), "the hint waited for the server past HINT_TIMEOUT_S"
    finally:
        silent.close()
    assert capsys.readouterr().err.splitlines()[0] == "stopped watching; job 01jobid is still running at step 7/40."


def test_the_progress_line_fits_80_columns_with_eta_and_average_speed() -> None:
    """The line rich redraws: numbers first, the bar and the name give way to them."""
    fields = {"status": "running", "epoch": "3/90", "loss": "0.123457", "sps": "12,345", "width": 80}
    task = Task(TaskID(0), "a-very-long-job-name-that-would-push-the-numbers-off-the-screen",
                total=123_456, completed=45_678, _get_time=lambda: 100.0, fields=fields)
    task.start_time = 90.0
    line = JobLine().render(task).plain
    assert "eta" not in line  # no speed measured yet

    task._progress = deque([ProgressSample(90.0, 0), ProgressSample(100.0, 1000)])  # 100 steps/s
    line = JobLine().render(task).plain

    assert len(line) <= 80, line
    assert line.startswith("a-very-…")  # the name gives way, and the labels shorten
    assert line.endswith(" running 45678/123456  ep 3/90  loss 0.123457  12,345/s  eta 12 min 58 s")
    short = JobLine().render(Task(TaskID(1), "cnn", total=400, completed=100, _get_time=lambda: 0.0,
                                  fields=fields)).plain
    assert short.startswith("cnn running ━") and len(short) <= 80  # room for a bar


def start_watch(server: Server, job_id: str) -> subprocess.Popen[str]:
    env = {**server.env, "ACCUM_URL": server.url, "ACCUM_TOKEN": server.token, "COLUMNS": "80",
           "PYTHONUNBUFFERED": "1",
           "PYTHONFAULTHANDLER": "1"}  # SIGABRT dumps every thread's stack (a hung watcher)
    env.pop("ACCUM_HOME", None)
    return subprocess.Popen(
        [ACCUM, "watch", job_id], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(process: subprocess.Popen[str], word: str) -> str:
    """Read the watcher's output until a line holds `word` (it has printed the history)."""
    assert process.stdout is not None
    os.set_blocking(process.stdout.fileno(), True)
    seen = ""
    deadline = time.monotonic() + WAIT_S
    while word not in seen:
        assert time.monotonic() < deadline and process.poll() is None, seen
        seen += process.stdout.readline()
    return seen


def test_events_lists_every_event_with_its_traceback(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any],
) -> None:
    job_id = client.submit(tiny_spec)["id"]
    seed.claim(job_id, "w1")
    seed.event(job_id, "traceback", "ValueError: bad shape", {"traceback": "Traceback ..."}, 1)
    seed.finish(job_id, "w1", "failed", {"type": "ValueError", "message": "bad shape"})

    code, out, _ = accum(capsys, "events", job_id[:12])
    assert code == 0
    assert_fits(out)
    assert [line[10:].split("  ")[0] for line in out.splitlines()] == [
        "created", "started", "traceback", "failed"]
    code, out, _ = accum(capsys, "events", job_id[:12], "--json")
    listed = json.loads(out)
    assert [e["kind"] for e in listed] == ["created", "started", "traceback", "failed"]
    assert listed[2]["data"]["traceback"] == "Traceback ..."
