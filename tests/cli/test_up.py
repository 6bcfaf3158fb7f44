"""End to end: `accum up` (real API + worker processes) runs a job that `accum watch` follows.

A tiny job (MLP on digits, one epoch) goes through `accum submit`, from another folder (the
per-user record `accum up` wrote), as does `accum token create`, into the service's own
database; `accum watch` must exit 0 when it succeeds; SIGTERM to `accum up` must stop the API
and the worker and exit 0.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_helpers import ACCUM, accum_env, run_accum

from services.ports import free_port

UP_TIMEOUT_S = 90.0


def wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            pytest.fail(f"accum up exited with {process.returncode}:\n{log.read_text()}")
        time.sleep(0.2)
    pytest.fail(f"accum up did not print {text!r} within {timeout} s:\n{log.read_text()}")


def children_of(up_pid: int) -> list[int]:
    """The child processes of `accum up` (its API and worker), found through /proc."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
        except OSError:
            continue
        ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), "")
        if ppid == str(up_pid):
            found.append(int(proc.name))
    return found


@pytest.mark.slow
def test_up_runs_a_job_that_watch_follows_to_success(
    tmp_path: Path, tiny_spec: dict[str, Any]
) -> None:
    home = tmp_path / "home"
    env = accum_env(home)
    port = free_port()
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        up = subprocess.Popen(
            [ACCUM, "up", "--port", str(port), "--log-dir", str(home / "logs")],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        wait_for_line(log, "accum is up at", up, UP_TIMEOUT_S)
        children = children_of(up.pid)
        assert len(children) == 2, "one API and one worker process"
        config_file = home / "local.json"
        config = json.loads(config_file.read_text())
        assert config["url"] == f"http://127.0.0.1:{port}"
        assert config["token"] in log.read_text(), "up prints the token it wrote"
        assert config_file.stat().st_mode & 0o777 == 0o600

        # Every other command from another folder, without ACCUM_HOME: through the per-user
        # record `accum up` wrote (XDG_CONFIG_HOME, the test's own).
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        env = {k: v for k, v in env.items() if k != "ACCUM_HOME"}
        record = json.loads((home / "user-config" / "accum" / "local.json").read_text())
        assert record == {**config, "home": str(home), "database_url": record["database_url"]}
        created = run_accum("token", "create", "from-elsewhere", env=env, cwd=elsewhere)
        assert created.returncode == 0, created.stderr
        assert f"using database sqlite:///{home / 'accum.sqlite'}" in created.stderr
        assert not (elsewhere / ".accum").exists(), "no second database"
        assert httpx.get(f"{config['url']}/v1/me", headers={
            "Authorization": f"Bearer {created.stdout.strip()}"}).json()["name"] == "from-elsewhere"

        spec = tmp_path / "tiny.json"
        spec.write_text(json.dumps(tiny_spec))
        submitted = run_accum("submit", str(spec), "--json", env=env, cwd=elsewhere)
        assert submitted.returncode == 0, submitted.stderr
        job_id = json.loads(submitted.stdout)["id"]

        watched = run_accum("watch", job_id, env={**env, "ACCUM_URL": config["url"]}, timeout=120,
                            cwd=elsewhere)  # the URL given: the token recorded for it
        assert watched.returncode == 0, watched.stdout + watched.stderr
        assert f"job {job_id} succeeded" in watched.stdout
        # Lifecycle events and the epoch-end evaluation came through the SSE stream.
        assert "  started  " in watched.stdout and "val_accuracy" in watched.stdout

        metrics = run_accum("metrics", job_id, "--name", "loss", "--csv", env=env, cwd=elsewhere)
        steps = [int(line.split(",")[1]) for line in metrics.stdout.splitlines()[1:]]
        assert steps == list(range(1, len(steps) + 1)) and steps, metrics.stdout
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(60)
    assert code == 0, log.read_text()
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)


@pytest.mark.slow
def test_up_is_quiet_by_default_and_says_where_the_logs_are(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = accum_env(home)
    port = free_port()
    log = tmp_path / "terminal.log"
    with log.open("wb") as out:
        up = subprocess.Popen([ACCUM, "up", "--port", str(port)], env=env, stdout=out,
                              stderr=subprocess.STDOUT)
    try:
        wait_for_line(log, "Ctrl-C stops", up, UP_TIMEOUT_S)
        token = json.loads((home / "local.json").read_text())["token"]
        for _ in range(3):  # what the dashboard does every few seconds
            httpx.get(f"http://127.0.0.1:{port}/v1/jobs", headers={"Authorization": f"Bearer {token}"})
        time.sleep(1)
        terminal = log.read_text()
        lines = terminal.splitlines()
        assert lines[0] == f"accum is up at http://127.0.0.1:{port}" and lines[1] == f"  token:    {token}"
        assert f"  logs:     {home / 'logs'} (accum up --verbose prints them here)" in lines
        assert "celery" not in terminal.lower() and "GET /v1/jobs" not in terminal
        assert (home / "logs" / "worker.log").exists()
        assert "GET /v1/jobs" in (home / "logs" / "api.log").read_text()
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0, log.read_text()
