"""The README's commands run as written: each `sh` block of "A first job" and "Your own data"
runs in bash, and its Python block in python, against a real `accum up` (API and worker
processes, SQLite) in a fresh directory holding the repository's examples/.

Only the port differs from what a reader runs: the README says 127.0.0.1:8000, the test
serves on a free port (other tests run beside it) and puts that in the blocks' text. The
blocks that run `make` (install, the whole suite, `accum up` in the foreground) are not run
here: `make test` is CI itself, and `tests/cli/test_up.py` runs `accum up`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import ACCUM, accum_env

from services.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 90.0
BLOCK_TIMEOUT_S = 300.0
README_URL = "http://127.0.0.1:8000"


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, text) of each fenced block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", markdown, flags=re.S | re.M)


def runnable_blocks() -> list[tuple[str, str]]:
    blocks = code_blocks((ROOT / "README.md").read_text())
    return [(lang, text) for lang, text in blocks
            if lang == "python" or (lang == "sh" and not text.lstrip().startswith("make "))]


def test_the_readme_has_its_blocks_tagged() -> None:
    languages = [lang for lang, text in runnable_blocks()]
    # the CLI, curl, Python and own-data blocks of a newcomer's first hour
    assert languages.count("sh") >= 3 and languages.count("python") == 1


def wait_until_up(log: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while "accum is up at" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"accum up did not start:\n{log.read_text()}")
        time.sleep(0.2)


@pytest.mark.slow
def test_the_readme_blocks_run_as_written(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = accum_env(tmp_path / ".accum")
    env["PATH"] = f"{Path(ACCUM).parent}{os.pathsep}{env.get('PATH', '')}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        up = subprocess.Popen([ACCUM, "up", "--port", str(port)], cwd=tmp_path, env=env,
                              stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_up(log, up)
        for lang, text in runnable_blocks():
            command = ["bash", "-euo", "pipefail", "-c"] if lang == "sh" else [sys.executable, "-c"]
            ran = subprocess.run([*command, text.replace(README_URL, url)], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False)
            assert ran.returncode == 0, f"{text}\nstdout:\n{ran.stdout}\nstderr:\n{ran.stderr}"
            if "python3 - > .accum/data/points/train.csv" in text:
                assert "succeeded" in ran.stdout.splitlines()[-1], ran.stdout  # the own-data job
            if lang == "python":
                assert ran.stdout.startswith("succeeded "), ran.stdout
    finally:
        up.terminate()
        up.wait(30)
