"""`accum logs`: what a job's training process printed, through a real worker, API and CLI.

A dataset plugin (a real distribution found by its entry point on the worker's path, not
installed into the environment) prints, warns, logs through a library logger, writes to
stderr, prints a secret of the worker's environment, one very long line and more lines than
the bound; its first build fails on purpose, so the job has two attempts. `accum logs` shows
each attempt's lines under its header, `--attempt 2` only the second's, `--follow` of the
finished job all of them; the bounds hold and say so; the secret is redacted; the worker's
own log still shows the lines (teed). A prefork pool's child and the two ranks a `gpus: 2`
job spawns (CPU ranks, gloo) are captured too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_process import running_api
from worker_stack import make_stack

from services.jobdb import tokens

SECRET = "chatty-secret-" + uuid.uuid4().hex
MAX_LINES = 25
MAX_LINE_BYTES = 200
PLUGIN = '''
import logging, os, sys, time, warnings
from pathlib import Path

import torch
from torch.utils.data import TensorDataset


def chatty_blobs(data_root=None, seed=0):
    print(f"chatty: building blobs with seed {seed}")
    print("chatty: the key is " + os.environ["AWS_SECRET_ACCESS_KEY"])
    print("chatty: " + "x" * 500)
    warnings.warn("chatty: 48 samples make a tiny dataset", UserWarning)
    logging.getLogger("chatty.library").warning("chatty: a library log message")
    sys.stderr.write("chatty: straight to stderr\\n")
    # stdout and stderr are two pipes: each keeps its order, lines close together on both may
    # be stored in either order; the fillers come later so that the bound drops only them.
    time.sleep(0.5)
    for i in range(50):
        print(f"chatty: filler {i}")
    fail_once = Path(os.environ["CHATTY_FAIL_ONCE"])
    if fail_once.exists():
        fail_once.unlink()
        raise RuntimeError("chatty: the first attempt fails on purpose")
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (48,), generator=generator)
    points = torch.randn(48, 1, 4, 4, generator=generator) + labels.view(-1, 1, 1, 1)
    data = TensorDataset(points, labels)
    return {"train": data, "val": data, "num_classes": 3, "channels": 1, "image_size": 4}
'''


def write_plugin(directory: Path) -> Path:
    """A distribution on a path: the module and its dist-info (entry point group
    ``accum.datasets``), as pip would lay it out."""
    directory.mkdir(parents=True)
    (directory / "chatty_plugin.py").write_text(PLUGIN)
    info = directory / "chatty_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: chatty-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[accum.datasets]\nchatty_blobs = chatty_plugin:chatty_blobs\n")
    return directory


@pytest.fixture(scope="module", params=["sqlite", "postgres_redis"])
def chatty(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("logs")
    plugin = write_plugin(tmp / "plugin")
    stack = make_stack(request.param, tmp, request)
    path = os.pathsep.join(p for p in (str(plugin), os.environ.get("PYTHONPATH", "")) if p)
    fail_once = tmp / "fail-once"
    fail_once.touch()
    stack.start_worker(PYTHONPATH=path, AWS_SECRET_ACCESS_KEY=SECRET, CHATTY_FAIL_ONCE=str(fail_once),
                       ACCUM_LOG_MAX_LINES_PER_ATTEMPT=str(MAX_LINES),
                       ACCUM_LOG_MAX_LINE_BYTES=str(MAX_LINE_BYTES))
    sys.path.insert(0, str(plugin))  # the spec is checked here, against the plugin's entry point
    try:
        with stack.sessions.begin() as session:
            stack.owner, token = tokens.create_owner_with_token(session, f"logs-{uuid.uuid4().hex[:6]}")
        job_id = stack.create(model="example_mlp", dataset="chatty_blobs", micro_batch_size=8,
                              accumulation_steps=2, max_steps=4, checkpoint_every=4)
        assert stack.wait(job_id, timeout=120).status == "failed", stack.worker_logs()
        stack.resume(job_id)
        assert stack.wait(job_id, timeout=120).status == "succeeded", stack.worker_logs()
        with running_api(stack.env(), stack.logs / "api.log") as api:
            env = {**stack.env(), "ACCUM_URL": api.url, "ACCUM_TOKEN": token, "COLUMNS": "80"}
            yield {"stack": stack, "job_id": job_id, "env": env, "tmp": tmp, "plugin_path": path}
    finally:
        sys.path.remove(str(plugin))
        stack.stop_workers()


def accum(chatty: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "services.cli", *args], env=chatty["env"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done


def test_accum_logs_shows_each_attempts_output_under_its_header(chatty: dict[str, Any]) -> None:
    out = accum(chatty, "logs", chatty["job_id"][:12]).stdout.splitlines()

    assert out[0] == "── attempt 1 ──" and "── attempt 2 ──" in out
    first, second = out[1:out.index("── attempt 2 ──")], out[out.index("── attempt 2 ──") + 1:]
    for lines in (first, second):
        assert "chatty: building blobs with seed 7" in lines
        assert "chatty: straight to stderr" in lines
        assert "WARNING chatty.library: chatty: a library log message" in lines
    # Python shows a warning once per place and process: the first attempt has it.
    assert any("UserWarning: chatty: 48 samples make a tiny dataset" in line for line in first)
    only_second = accum(chatty, "logs", chatty["job_id"], "--attempt", "2").stdout.splitlines()
    assert only_second == second


def test_secrets_are_redacted_and_the_bounds_hold_and_are_said(chatty: dict[str, Any]) -> None:
    done = accum(chatty, "logs", chatty["job_id"], "--json")
    lines = json.loads(done.stdout)

    assert SECRET not in done.stdout
    assert any(item["line"] == "chatty: the key is [redacted AWS_SECRET_ACCESS_KEY]" for item in lines)
    for attempt in (1, 2):
        mine = [item for item in lines if item["attempt"] == attempt]
        printed = [item for item in mine if item["stream"] != "accum"]
        notes = [item["line"] for item in mine if item["stream"] == "accum"]
        assert len(printed) == MAX_LINES
        assert all(len(item["line"].encode()) <= MAX_LINE_BYTES + 100 for item in printed)
        assert "ACCUM_LOG_MAX_LINES_PER_ATTEMPT" in notes[0] and "more lines were dropped" in notes[-1]
    cut = next(item["line"] for item in lines if item["line"].startswith("chatty: xxx"))
    assert f"line cut at {MAX_LINE_BYTES} bytes" in cut and "it had 508" in cut
    # Teed: the worker's own output has every line, past the bound too.
    worker_logs = "".join(p.read_text(errors="replace") for p in chatty["stack"].logs.glob("worker-*.log"))
    assert worker_logs.count("chatty: filler 49") == 2


def test_follow_on_a_finished_job_prints_every_line_and_ends(chatty: dict[str, Any]) -> None:
    followed = accum(chatty, "logs", chatty["job_id"], "--follow", "--attempt", "1").stdout.splitlines()
    listed = accum(chatty, "logs", chatty["job_id"], "--attempt", "1").stdout.splitlines()
    assert followed == listed and len(listed) >= MAX_LINES


@pytest.mark.slow
def test_the_ranks_of_a_multi_process_job_are_captured_too(chatty: dict[str, Any]) -> None:
    stack = chatty["stack"]
    ranks = stack.variant(chatty["tmp"] / "ranks")
    ranks.owner = stack.owner
    ranks.start_worker(args=("--cpu-ranks", "2"), PYTHONPATH=chatty["plugin_path"], AWS_SECRET_ACCESS_KEY=SECRET,
                       CHATTY_FAIL_ONCE=str(chatty["tmp"] / "no-such-file"))
    try:
        job_id = ranks.create(model="example_mlp", dataset="chatty_blobs", micro_batch_size=8,
                              accumulation_steps=1, max_steps=3, checkpoint_every=3, gpus=2)
        assert ranks.wait(job_id, timeout=300).status == "succeeded", ranks.worker_logs()  # 2 cores, shared
    finally:
        ranks.stop_workers()
    lines = json.loads(accum(chatty, "logs", job_id, "--json").stdout)
    # Each rank builds the dataset in its own process: each one's lines are the job's.
    assert [item["line"] for item in lines].count("chatty: building blobs with seed 7") == 2
    assert [item["line"] for item in lines].count("chatty: filler 49") == 2
    assert {item["attempt"] for item in lines} == {1}


@pytest.mark.slow
def test_a_prefork_pools_child_is_captured_too(chatty: dict[str, Any]) -> None:
    stack = chatty["stack"]
    prefork = stack.variant(chatty["tmp"] / "prefork")
    prefork.owner = stack.owner
    prefork.start_worker(pool="prefork", PYTHONPATH=chatty["plugin_path"], AWS_SECRET_ACCESS_KEY=SECRET,
                         CHATTY_FAIL_ONCE=str(chatty["tmp"] / "no-such-file"))
    try:
        job_id = prefork.create(model="example_mlp", dataset="chatty_blobs", micro_batch_size=8,
                                accumulation_steps=2, max_steps=3, checkpoint_every=3)
        assert prefork.wait(job_id, timeout=300).status == "succeeded", prefork.worker_logs()
    finally:
        prefork.stop_workers()
    lines = [item["line"] for item in json.loads(accum(chatty, "logs", job_id, "--json").stdout)]
    # The pool's child runs the job: print, warning and library record, not Celery's wrapping.
    assert "chatty: building blobs with seed 7" in lines
    assert "WARNING chatty.library: chatty: a library log message" in lines
    assert any("UserWarning: chatty: 48 samples make a tiny dataset" in line for line in lines)
    assert not any("WARNING/ForkPoolWorker" in line for line in lines)
