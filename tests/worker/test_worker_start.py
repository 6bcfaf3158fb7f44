"""A worker whose artifact store is not writable refuses to start, with one line naming the
store's URL and the error (a real ``python -m services.worker`` process); one with a working
S3 store starts. ``--cpu-ranks`` outside its setting's bounds stops it naming the bound. As root
it refuses to start unless ACCUM_ALLOW_ROOT=1 (these tests run as root on the CI machine: the
helper below sets it, as every fixture that starts a worker does)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.ports import free_port
from services.settings import Settings
from services.worker.start import refuse_root, with_cpu_ranks_setting

ROOT = Path(__file__).resolve().parents[2]


def worker(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.worker", "--queues", "start-test"],
        cwd=ROOT, env={**os.environ, "ACCUM_HOME": str(tmp_path / "home"), "ACCUM_ALLOW_ROOT": "1", **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_a_worker_refuses_to_run_as_root_unless_told_to(tmp_path: Path) -> None:
    """Issue 42 item 4: a worker run as root outside Docker ran every job's code as root (and
    its errors showed /root/...). The refusal says how to run it, and how to override."""
    settings = Settings(home=tmp_path / "home", allow_root=False)
    with pytest.raises(SystemExit, match=r"refusing to run as root.*ACCUM_ALLOW_ROOT=1"):
        refuse_root(settings, euid=0)
    refuse_root(settings, euid=1000)
    refuse_root(settings.model_copy(update={"allow_root": True}), euid=0)
    if os.geteuid() == 0:  # and the real process, where this machine lets us be root
        process = worker(tmp_path, ACCUM_ALLOW_ROOT="0")
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 1 and stderr.strip().splitlines()[-1].startswith(
            "accum worker: refusing to run as root"), stderr


def test_an_unreachable_s3_store_stops_the_worker_with_one_line(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    process = worker(tmp_path, ACCUM_ARTIFACTS_URL="s3://accum/artifacts", AWS_ENDPOINT_URL=endpoint,
                     AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x", AWS_REGION="eu-west-3")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "s3://accum/artifacts is not writable" in lines[0] and "AWS_ENDPOINT_URL" in lines[0]


def test_a_local_store_that_cannot_be_created_stops_the_worker(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    process = worker(tmp_path, ACCUM_ARTIFACTS_URL=str(blocker / "artifacts"))
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1 and str(blocker / "artifacts") in stderr.strip().splitlines()[-1]


def test_a_writable_s3_store_lets_the_worker_start(tmp_path: Path, s3_url: str) -> None:
    process = worker(tmp_path, ACCUM_ARTIFACTS_URL=s3_url)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.5)
            if (tmp_path / "home" / "broker.sqlite").exists():
                break  # Celery connected to its (embedded) broker: the check passed
        assert process.poll() is None
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_cpu_ranks_out_of_the_settings_bounds_stop_the_worker_naming_the_bound(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    assert with_cpu_ranks_setting(settings, 3).cpu_ranks == 3 and settings.cpu_ranks == 0
    with pytest.raises(SystemExit, match=r"--cpu-ranks 65: input should be less than or equal to 64"):
        with_cpu_ranks_setting(settings, 65)
