"""A real API server for the CLI and client tests: uvicorn in a subprocess, SQLite, tmp home.

The database is migrated and the token created with the real console script
(`accum db upgrade`, `accum token create`), so those commands are exercised as users run them.
No worker runs here: jobs stay queued unless a test moves them; results (metrics,
checkpoints) are seeded through the store functions the worker uses.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import ACCUM, Server, accum_env, run_accum, wait_until_ready
from job_specs import MINIMAL_SPEC

from accum import AccumClient
from services.ports import free_port

START_TIMEOUT_S = 30.0


@pytest.fixture(autouse=True)
def own_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test its own per-user config dir (accum.config): never the real ~/.config/accum."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user-config"))

@pytest.fixture(scope="session")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("cli-home")
    env = accum_env(home)
    upgraded = run_accum("db", "upgrade", env=env)
    assert upgraded.returncode == 0, upgraded.stderr
    created = run_accum("token", "create", "cli-tests", env=env)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token and "\n" not in token, "the token alone is printed on stdout"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (home / "api.log").open("wb")
    process = subprocess.Popen(
        [ACCUM, "api", "--port", str(port), "--log-level", "warning"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_until_ready(url, process, START_TIMEOUT_S)
        yield Server(url=url, token=token, home=home, env=env)
    finally:
        process.terminate()
        process.wait(10)
        log.close()


@pytest.fixture
def client(api_server: Server) -> Iterator[AccumClient]:
    with AccumClient(api_server.url, api_server.token) as c:
        yield c


@pytest.fixture
def cli_env(api_server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Server:
    """Point the in-process CLI at the test server through ACCUM_URL / ACCUM_TOKEN."""
    for key in [k for k in os.environ if k.startswith("ACCUM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("ACCUM_HOME", str(tmp_path / "client-home"))
    monkeypatch.setenv("ACCUM_URL", api_server.url)
    monkeypatch.setenv("ACCUM_TOKEN", api_server.token)
    monkeypatch.setenv("COLUMNS", "80")  # every command's output is checked at 80 columns
    return api_server


@pytest.fixture(scope="session")
def admin_token(api_server: Server) -> str:
    created = run_accum("token", "create", "cli-admin", "--admin", env=api_server.env)
    assert created.returncode == 0, created.stderr
    return created.stdout.strip()


class Seeder:
    """Writes what a worker would (metrics, checkpoint file + row) through the store functions."""

    def __init__(self, home: Path) -> None:
        from services.jobdb.db import make_engine, make_session_factory
        from services.settings import Settings

        self.settings = Settings(home=home)
        self.engine = make_engine(self.settings)
        self.sessions = make_session_factory(self.engine)

    def metrics(self, job_id: str, steps: int, names: tuple[str, ...] = ("loss",)) -> None:
        from services.jobdb.metrics import write_metrics

        rows = [
            {"name": name, "step": step, "epoch": 0, "value": 1.0 / step}
            for name in names
            for step in range(1, steps + 1)
        ]
        with self.sessions.begin() as session:
            write_metrics(session, job_id, 0, rows)

    def rows(self, job_id: str, rows: list[dict[str, Any]], attempt: int = 1) -> None:
        """Metric rows as given (name, step, epoch, value, ts: the worker's own)."""
        from services.jobdb.metrics import write_metrics

        with self.sessions.begin() as session:
            write_metrics(session, job_id, attempt, rows)

    def claim(self, job_id: str, worker: str, now: Any = None) -> None:
        """The job taken by `worker` (a takeover when `now` is past the holder's lease)."""
        from services.jobdb.leases import claim_job

        with self.sessions.begin() as session:
            assert claim_job(session, job_id, worker, f"host-{worker}", None, 60, now=now)

    def event(self, job_id: str, kind: str, message: str, data: dict[str, Any], attempt: int) -> None:
        from services.jobdb.events import add_event

        with self.sessions.begin() as session:
            add_event(session, job_id, kind, message, data, attempt=attempt)

    def progress(self, job_id: str, step: int, latest: dict[str, Any], epoch: int = 0) -> None:
        from services.jobdb.leases import update_progress

        with self.sessions.begin() as session:
            update_progress(session, job_id, {"optimizer_step": step, "epoch": epoch}, latest)

    def prints(self, job_id: str, attempt: int, lines: list[tuple[str, str]]) -> None:
        """Lines the job's training printed, as the worker's capture stores them."""
        from services.jobdb.job_logs import add_lines

        with self.sessions.begin() as session:
            add_lines(session, job_id, attempt, lines)

    def finish(self, job_id: str, worker: str, status: str, error: dict[str, Any] | None = None) -> None:
        from services.jobdb.leases import finish_job

        with self.sessions.begin() as session:
            assert finish_job(session, job_id, worker, status, error)

    def checkpoint(self, job_id: str, step: int, content: bytes, sha256: str | None = None) -> Path:
        """A checkpoint file and its row; `sha256` overrides the recorded hash (corruption)."""
        import hashlib

        from services.jobdb.checkpoints import add_checkpoint

        path = self.settings.artifacts_path / job_id / f"{step}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        digest = sha256 or hashlib.sha256(content).hexdigest()
        with self.sessions.begin() as session:
            add_checkpoint(
                session, job_id, step, key=f"{job_id}/{step}.pt", size_bytes=len(content), sha256=digest,
                epoch=0, metrics={"val_loss": 1.0 / step},
            )
        return path


@pytest.fixture(scope="session")
def seed(api_server: Server) -> Iterator[Seeder]:
    seeder = Seeder(api_server.home)
    yield seeder
    seeder.engine.dispose()


@pytest.fixture
def tiny_spec() -> dict[str, Any]:
    """The smallest real job: an MLP on digits for one epoch."""
    return {"name": "cli-tiny", **MINIMAL_SPEC, "optimizer": dict(MINIMAL_SPEC["optimizer"])}


@pytest.fixture
def job_with_metrics(client: AccumClient, seed: Seeder, tiny_spec: dict[str, Any]) -> str:
    """A queued job with `loss` and `lr` at steps 1..4 (value 1/step); its id."""
    job_id = str(client.submit(tiny_spec)["id"])
    seed.metrics(job_id, steps=4, names=("loss", "lr"))
    return job_id
