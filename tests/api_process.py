"""The API as production starts it (``accum api``, uvicorn) in a subprocess on a free port.

    with running_api(stack.env(), stack.logs / "api.log") as api:
        httpx.get(f"{api.url}/healthz")
        api.process.send_signal(signal.SIGTERM)
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0


@dataclass
class ApiProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@contextmanager
def running_api(env: dict[str, str], log: Path, *args: str) -> Iterator[ApiProcess]:
    """``python -m services.cli api`` with ``env`` (ACCUM_* settings) and extra ``args``,
    ready when yielded (``/healthz`` answers); stopped (SIGTERM, then SIGKILL) afterwards."""
    port = free_port()
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "api", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning", *args],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    api = ApiProcess(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(api.url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not come up:\n{api.log_tail()}")
            time.sleep(0.05)
        yield api
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
