"""Private Redis and PostgreSQL servers that a fault test may stop and restart.

The shared servers on 6379/5432 serve every other test (and other people's runs): a fault test
never touches them. It starts its own instance on a free port instead, under a temp dir, and
the fixture removes it afterwards.

    def test_x(private_redis: PrivateRedis, private_postgres: PrivatePostgres) -> None:
        private_redis.stop(); ...; private_redis.start()
        url = private_postgres.create_database()      # a fresh database on the private cluster

PostgreSQL refuses to run as root: when the tests run as root, the cluster is created and run
as the ``postgres`` user (``runuser``), in a directory that user owns.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from skips import services_required

from services.ports import free_port

START_TIMEOUT_S = 30.0


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5):
            return True
    except OSError:
        return False


def missing(what: str, how: str) -> None:
    """Skip (or fail under ACCUM_REQUIRE_SERVICES=1) when a server binary is absent."""
    message = f"{what} is not installed; {how}"
    if services_required():
        pytest.fail(f"ACCUM_REQUIRE_SERVICES=1 but {message}")
    pytest.skip(message)


class PrivateRedis:
    """``redis-server`` on a free port, without persistence (a restart loses every key, as a
    crashed or replaced production Redis without AOF does)."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary, self.workdir = binary, workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=log, stderr=subprocess.STDOUT,
        )
        wait_until(lambda: port_open(self.port), f"redis-server on port {self.port}")

    def stop(self) -> None:
        """SIGTERM and wait: the port is closed when this returns."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=START_TIMEOUT_S)
        self.process = None


class PrivatePostgres:
    """A throw-away cluster made with ``initdb``, listening on 127.0.0.1 and a free port."""

    def __init__(self, bindir: Path, workdir: Path) -> None:
        self.bindir, self.workdir = bindir, workdir
        self.data = workdir / "data"
        self.sockets = workdir / "sockets"
        self.port = free_port()
        self.base_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}"

    def _run(self, *args: str) -> None:
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        result = subprocess.run([*as_postgres, *args], capture_output=True, text=True,
                                timeout=START_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{result.stdout}{result.stderr}")

    def init(self) -> None:
        self.sockets.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.workdir, "postgres")
            shutil.chown(self.sockets, "postgres")
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust",
                  "-U", "postgres", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        """Start and wait until it accepts connections (``pg_ctl -w``)."""
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.sockets} -c fsync=off"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                  str(self.workdir / "postgres.log"), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """``fast``: what an operator's restart does (clients are disconnected, no wait)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def create_database(self) -> str:
        """A new, empty database on this cluster; returns its SQLAlchemy URL."""
        from sqlalchemy import create_engine, text

        name = f"accum_fault_{uuid.uuid4().hex[:8]}"
        admin = create_engine(f"{self.base_url}/postgres", isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        return f"{self.base_url}/{name}"

    def running(self) -> bool:
        return port_open(self.port)


def wait_until(ready: Callable[[], bool], what: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {timeout_s:.0f}s")
        time.sleep(0.02)


def postgres_bindir() -> Path | None:
    for candidate in [os.path.dirname(shutil.which("initdb") or ""),
                      *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]:
        if candidate and all(Path(candidate, b).exists() for b in ("initdb", "pg_ctl", "postgres")):
            return Path(candidate)
    return None


@pytest.fixture(scope="module")
def private_redis() -> Iterator[PrivateRedis]:
    """A running private ``redis-server`` (module-scoped: a test may stop and restart it)."""
    binary = shutil.which("redis-server")
    if binary is None:
        missing("redis-server", "install it with: apt-get install redis-server")
    with tempfile.TemporaryDirectory(prefix="accum-redis-") as workdir:
        server = PrivateRedis(str(binary), Path(workdir))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL cluster (module-scoped: a test may stop and restart it)."""
    bindir = postgres_bindir()
    if bindir is None:
        missing("PostgreSQL (initdb, pg_ctl)", "install it with: apt-get install postgresql")
    # /tmp, not pytest's tmp_path: the postgres user must be able to reach the directory.
    workdir = Path(tempfile.mkdtemp(prefix="accum-pg-"))
    os.chmod(workdir, 0o755)
    server = PrivatePostgres(bindir, workdir)  # type: ignore[arg-type]
    try:
        server.init()
        server.start()
        yield server
    finally:
        if server.running() or (server.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                server.stop("immediate")
        shutil.rmtree(workdir, ignore_errors=True)
