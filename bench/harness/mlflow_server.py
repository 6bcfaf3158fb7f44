"""A real MLflow tracking server on localhost (``mlflow server``, SQLite backend), for the
tracker tests (tests/worker/test_trackers.py) and bench (bench/trainer/tracker_overhead.py):
started in its own process group, so stopping it ends its uvicorn and job workers too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

MLFLOW = Path(sys.executable).with_name("mlflow")


@dataclass
class MlflowServer:
    root: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            [str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # No job queue: its huey consumers (seven processes) poll all the time, about one
            # core of this 2-core machine between them, which tracking does not use.
            env={**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                 "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.uri}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not up in {timeout_s} s: {(self.root / 'server.log').read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # its own group: the server we started
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None
