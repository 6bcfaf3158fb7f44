"""The embedded local service behind `accum up` and `accum demo`.

Migrates the database, makes sure ACCUM_HOME/local.json holds a token that works (`accum up`:
the per-user record too, see accum.config), and runs the API (uvicorn, real HTTP) and one
worker as child processes. Children get their own session, so Ctrl-C reaches only this
process, which then stops them in order: a SIGTERM, and after a grace period SIGKILL (a job
that was running is picked up again through its lease).

The worker starts first and the API only once the worker is in the registry: from the API's
first answer, a submit is checked against the fleet (services/fleet.py) that will run it; a
`gpus: 2` job is a 422 then as a minute later, never 2 ranks on a worker that offers none.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

import httpx

from accum.config import read_local_config, user_config_path, write_config_file, write_local_config
from services.cli.admin import create_token, upgrade_database

if TYPE_CHECKING:
    from services.settings import Settings

LOCAL_OWNER = "local"
READY_TIMEOUT_S = 60.0
# The worker imports torch before it registers: slower than the API on a loaded machine.
WORKER_READY_TIMEOUT_S = 180.0
STOP_GRACE_S = 15.0


class LocalServiceError(Exception):
    """A child process failed to start or died; the message carries its log tail."""


class Terminated(Exception):
    """SIGTERM arrived: unwind like Ctrl-C so the children are stopped."""


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM if `accum up` itself is killed (no orphaned workers)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class LocalService:
    """API + worker on `host:port`, state under `settings.home`.

    `log_dir=None` lets the children write to this terminal; otherwise each child logs to
    `<log_dir>/<name>.log`.
    """

    settings: Settings
    host: str = "127.0.0.1"
    port: int = 8000
    log_dir: Path | None = None
    cpu_ranks: int | None = None  # the worker's --cpu-ranks
    # `accum up`: also record URL, token and database in the per-user config, where the CLI
    # and AccumClient() find them from any folder (accum.config); `accum demo` stops at once.
    record_for_user: bool = False
    children: list[Child] = field(default_factory=list)
    token: str = ""
    worker_args: list[str] = field(default_factory=list)  # what `start` ran the worker with

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> str:
        """Migrate, start API and worker, wait until ready; returns the token."""
        home = Path(self.settings.home)
        home.mkdir(parents=True, exist_ok=True)
        self._check_port_free()
        upgrade_database(self.settings)
        worker = f"local-{os.getpid()}@{socket.gethostname()}"
        ranks = [] if self.cpu_ranks is None else ["--cpu-ranks", str(self.cpu_ranks)]
        self.worker_args = ["worker", "--hostname", worker, *ranks]
        self._spawn("worker", self.worker_args)
        self._wait_registered(worker)
        self._spawn("api", ["api", "--host", self.host, "--port", str(self.port)])
        self._wait_ready()
        self.token = self._working_token()
        write_local_config(self.url, self.token, home)
        if self.record_for_user:
            write_config_file(user_config_path(), {
                "url": self.url, "token": self.token, "home": str(home),
                "database_url": self.settings.database_url,
            })
        return self.token

    def stop(self) -> None:
        """SIGTERM every child, then SIGKILL what is still alive after the grace period."""
        for child in self.children:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in self.children:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                child.process.wait(remaining)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        self.children.clear()

    def __enter__(self) -> LocalService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def dead_child(self) -> Child | None:
        return next((c for c in self.children if c.process.poll() is not None), None)

    def wait(self) -> None:
        """Block until a child exits on its own (then raise) or this process is interrupted. A
        worker that exits because a hung job's training thread was left in it (exit code
        ``services.worker.shutdown.EXIT_ABANDONED``: the job is recorded and queued again) is
        started again, as a deployment's supervisor would."""
        # Lazy: the client commands load none of the worker.
        from services.worker.shutdown import EXIT_ABANDONED

        while True:
            child = self.dead_child()
            if child is not None and child.name == "worker" and child.process.returncode == EXIT_ABANDONED:
                print(f"accum: the worker left a hung job's thread behind and exited ({EXIT_ABANDONED}); "
                      "the job resumes from its last checkpoint on a fresh worker", file=sys.stderr, flush=True)
                self.children.remove(child)
                self._spawn("worker", self.worker_args)
                continue
            if child is not None:
                raise LocalServiceError(self._death_message(child))
            time.sleep(0.5)

    # -- internals --------------------------------------------------------------------
    def _spawn(self, name: str, cli_args: list[str]) -> None:
        env = {**os.environ, "ACCUM_HOME": str(self.settings.home), "PYTHONUNBUFFERED": "1"}
        env["ACCUM_DATABASE_URL"] = self.settings.database_url
        env["ACCUM_BROKER_URL"] = self.settings.broker_url
        # One machine, one person: whoever runs `accum up` or `accum demo` runs the jobs' code
        # with their own rights anyway, root on a container or CI box included. The root
        # refusal (services/worker/start.py refuse_root) guards a deployed `accum worker`.
        env.setdefault("ACCUM_ALLOW_ROOT", "1")
        log_path: Path | None = None
        out: IO[bytes] | None = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"{name}.log"
            out = log_path.open("wb")  # one run per file: the tail shown on failure is this run
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "services.cli", *cli_args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        finally:
            if out is not None:
                out.close()
        self.children.append(Child(name, process, log_path))

    def _check_port_free(self) -> None:
        """Fail early: otherwise the readiness probe could find another server on the port."""
        with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET) as sock:
            # As uvicorn does: connections of a previous server in TIME_WAIT do not count.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, self.port))
            except OSError as exc:
                raise LocalServiceError(
                    f"cannot serve on {self.host}:{self.port} ({exc.strerror}); another `accum up` "
                    "may be running there: stop it, or choose another port with --port"
                ) from exc

    def _wait_registered(self, name: str) -> None:
        """Until the worker's registry row is there (it writes it once it consumes)."""
        # Lazy, as in admin.py: the client commands of this CLI load no SQLAlchemy.
        from sqlalchemy import select

        from services.jobdb.models import Worker
        from services.jobdb.sessions import session_factory

        deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            child = self.dead_child()
            if child is not None:
                raise LocalServiceError(self._death_message(child))
            with session_factory(self.settings)() as session:
                if session.scalar(select(Worker.name).where(Worker.name == name,
                                                            Worker.stopped_at.is_(None))):
                    return
            time.sleep(0.2)
        raise LocalServiceError(
            f"the worker {name} did not register within {WORKER_READY_TIMEOUT_S:.0f} s"
            + self._log_hint()
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(base_url=self.url, timeout=2.0) as http:
            while time.monotonic() < deadline:
                child = self.dead_child()
                if child is not None:
                    raise LocalServiceError(self._death_message(child))
                with contextlib.suppress(httpx.HTTPError):
                    if http.get("/readyz").status_code == 200:
                        return
                time.sleep(0.2)
        raise LocalServiceError(
            f"the API did not become ready at {self.url}/readyz within {READY_TIMEOUT_S:.0f} s"
            + self._log_hint()
        )

    def _working_token(self) -> str:
        """The token in local.json if the API accepts it, else a new one for owner `local`.

        The database keeps only token hashes, so local.json is the one place the clear text
        lives; a deleted database or a stale file gets a fresh token.
        """
        token = read_local_config(Path(self.settings.home)).get("token", "")
        if token:
            headers = {"Authorization": f"Bearer {token}"}
            response = httpx.get(f"{self.url}/v1/jobs", params={"limit": 1}, headers=headers)
            if response.status_code == 200:
                return token
        return create_token(self.settings, LOCAL_OWNER, admin=True)

    def _death_message(self, child: Child) -> str:
        code = child.process.returncode
        tail = child.log_tail()
        message = f"the {child.name} process exited with code {code}"
        if code is not None and code < 0:
            message += f" (signal {signal.Signals(-code).name})"
        return message + (f"; last lines of {child.log_path}:\n{tail}" if tail else "")

    def _log_hint(self) -> str:
        logs = [str(c.log_path) for c in self.children if c.log_path]
        return f"; see {', '.join(logs)}" if logs else ""


@contextlib.contextmanager
def sigterm_as_exception() -> Iterator[None]:
    """Turn SIGTERM into `Terminated` so `finally` blocks stop the children (SIGINT is a
    KeyboardInterrupt for every command: ``services.cli.interrupts``, set in ``main``)."""

    def handler(signum: int, frame: object) -> None:
        raise Terminated()

    previous_term = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
