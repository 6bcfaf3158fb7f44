"""The training process's side of the tracker host (``host``): hands a job's points over to
it, a flush period's batch at a time.

The training thread only appends each metrics dict, by reference, to a list (``push``, under
a lock nobody else holds but for the swap). A light thread of this process takes the list
every ``flush_every_s`` and sends it to the host with the commands since (tags, the end):
one pickle a batch. Another thread, asleep in a read, takes the host's progress reports
(``status``) and its ``DONE``. A host that dies before its end is logged and reported as a
``tracker_host_lost`` event; the job goes on without it (it is not restarted: the points it
had not delivered, and this attempt's later ones, reach the tracker with the job's next
attempt if there is one, from accum's metrics store; docs/trackers.md).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import secrets
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from multiprocessing.connection import Client, Connection
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from services.jobdb.events import add_event
from services.settings import Settings
from services.worker.trackers.base import FinalCheckpoint, RunIdentity
from services.worker.trackers.host import DONE, HostStarted, SinkStatus, host_main, server_main

log = logging.getLogger(__name__)
JOIN_S = 10.0  # a host that said DONE exits at once; this is only a bound


class TrackerHost:
    def __init__(self, settings: Settings, spec_data: dict[str, Any], attempt: int,
                 identities: dict[str, RunIdentity], sessions: sessionmaker[Session]) -> None:
        self.settings, self.spec_data, self.attempt = settings, spec_data, attempt
        self.identities, self.sessions = identities, sessions
        self.job_id = next(iter(identities.values())).job_id
        self._raw: list[dict[str, Any]] = []  # the training thread's, by reference
        self._commands: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.process: Any = None
        self.done = threading.Event()  # the host delivered and finished everything, or died
        self.exited = threading.Event()  # the host process has ended and is reaped
        self.lost = False
        self.started: HostStarted | None = None  # once the host's clients are set up
        self.status = {name: SinkStatus(delivered_step=i.delivered_step)
                       for name, i in identities.items()}
        self.host_cpu_s = 0.0  # the host process's CPU since its clients were set up
        self.handover_cpu_s = 0.0  # this process's hand-over thread (bench/trainer/tracker_overhead)

    # ------------------------------------------------------------- the training thread
    def start(self) -> None:
        if _shared is not None:  # the worker's host: one connection for both ways
            self._to_host, self.process = _shared.connect(self.settings)
            self._from_host = self._to_host
            self._to_host.send((self.settings.model_dump(mode="json"), self.spec_data, self.attempt,
                                self.identities))
            for target, name in ((self._send_loop, "send"), (self._receive_loop, "receive")):
                threading.Thread(target=target, name=f"accum-trackers-{name}", daemon=True).start()
            return
        spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch, no fork
        to_host, self._to_host = spawn.Pipe(duplex=False)
        self._from_host, from_host = spawn.Pipe(duplex=False)
        self.process = spawn.Process(
            target=host_main, name=f"accum-trackers-{self.job_id}", daemon=True,
            args=(to_host, from_host, self.settings.model_dump(mode="json"), self.spec_data,
                  self.attempt, self.identities))
        with without_main_module():
            self.process.start()
        to_host.close()  # the host's ends: its exit is this side's EOF
        from_host.close()
        for target, name in ((self._send_loop, "send"), (self._receive_loop, "receive")):
            threading.Thread(target=target, name=f"accum-trackers-{name}", daemon=True).start()

    def push(self, metrics: dict[str, Any]) -> None:
        """A step's (or an evaluation's) metrics dict, ``step`` included; read later, on the
        hand-over thread, so it must not change after."""
        with self._lock:
            self._raw.append(metrics)

    def tag(self, key: str, value: str) -> None:
        self._command("tag", key, value)

    def end(self, status: str | None, checkpoint: FinalCheckpoint | None) -> None:
        """Hand the rest over and end the runs (status None: left open for a later attempt)."""
        self._command("end", status, checkpoint)

    def flush(self) -> None:
        """Hand what is buffered over now, and have the sinks deliver it now, rather than at
        their next flush periods (up to two of them later); each run's last step stays held
        back as always (its evaluation may follow)."""
        self._command("flush")

    def wait(self, wait_s: float) -> None:
        """Up to ``wait_s`` for the host to deliver and finish; a host whose tracker is still
        down goes on on its own (until it is back, or the worker dies)."""
        if self.done.wait(wait_s):
            self.exited.wait(JOIN_S)
            return
        log.warning("job %s: the trackers have not taken every point by the end of the "
                    "attempt; their host process goes on delivering them", self.job_id)

    def take(self) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
        with self._lock:
            raw, self._raw = self._raw, []
            commands, self._commands = self._commands, []
        return raw, commands

    def _command(self, *command: Any) -> None:
        with self._lock:
            self._commands.append(command)
        if command[0] in ("end", "flush"):
            self._wake.set()

    # ------------------------------------------------------------- its own threads
    def _send_loop(self) -> None:
        ending = False
        while not ending:
            self._wake.wait(self.settings.tracker_flush_every_s)
            self._wake.clear()
            started = time.thread_time()
            raw, commands = self.take()
            ending = any(command[0] == "end" for command in commands)
            if (raw or commands) and not self.lost:
                with contextlib.suppress(OSError):  # the host died: the reader reports it
                    self._to_host.send((raw, commands))
            self.handover_cpu_s += time.thread_time() - started
        if self._from_host is not self._to_host:  # the shared host's connection: its reader closes it
            self._to_host.close()

    def _receive_loop(self) -> None:
        while True:
            try:
                message = self._from_host.recv()
            except (EOFError, OSError):
                break
            if message == DONE:
                self.done.set()
            elif isinstance(message, HostStarted):
                self.started = message
            else:
                self.status, self.host_cpu_s = message
        if self._from_host is self._to_host:  # the shared host: done with this attempt, or dead
            self._from_host.close()
            if not self.done.is_set() and _shared is not None:
                _shared.reap(self.process)
        else:
            self.process.join()  # reaped (here only: two threads' waitpid would race)
        self.exited.set()
        if not self.done.is_set():
            self._report_lost()

    def _report_lost(self) -> None:
        self.lost = True  # the hand-over thread drops what it takes from now on
        names = sorted(self.identities)
        message = (f"the tracker host process for {', '.join(names)} died (exit code "
                   f"{self.process.exitcode}); the job goes on, and the points it had not "
                   "delivered reach the trackers with the job's next attempt, if any, from "
                   "accum's metrics store (the worker's log has the host's error)")
        log.warning("job %s: %s", self.job_id, message)
        try:
            with self.sessions.begin() as session:
                add_event(session, self.job_id, "tracker_host_lost", message,
                          {"trackers": names, "exitcode": self.process.exitcode},
                          attempt=self.attempt)
        except Exception:
            log.warning("job %s: recording the tracker host's death failed", self.job_id,
                        exc_info=True)
        self.done.set()  # the attempt's end waits no more


class SharedHost:
    """The worker's tracker host (``share_host``): one process (``host.server_main``) for
    every attempt of this worker, started by the first that logs to a tracker, its clients
    imported once; started again by the next attempt after it died."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: Any = None
        self.address = ""
        self.authkey = b""

    def connect(self, settings: Settings) -> tuple[Connection, Any]:
        """A connection of the attempt's own to the host (started now if it is not running)."""
        with self.lock:
            if self.process is None or not self.process.is_alive():
                self._start(settings)
            return Client(self.address, family="AF_UNIX", authkey=self.authkey), self.process

    def _start(self, settings: Settings) -> None:
        spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch, no fork
        folder = tempfile.mkdtemp(prefix="accum-trackers-")
        self.address, self.authkey = os.path.join(folder, "host.sock"), secrets.token_bytes(32)
        ready, ready_in_host = spawn.Pipe(duplex=False)
        self.process = spawn.Process(
            target=server_main, name="accum-trackers", daemon=True,
            args=(self.address, self.authkey, settings.model_dump(mode="json"), ready_in_host))
        with without_main_module():
            self.process.start()
        ready_in_host.close()
        try:
            ready.recv()  # listening
        except EOFError as exc:
            self.process.join(JOIN_S)
            raise RuntimeError(f"the tracker host exited at its start (exit code {self.process.exitcode})") from exc
        finally:
            ready.close()

    def reap(self, process: Any) -> None:
        """A host that died: reaped once (its exit code for the ``tracker_host_lost`` event),
        by one of the attempts that lost it."""
        with self.lock:
            process.join(JOIN_S)

    def stop(self) -> None:
        with self.lock:
            if self.process is not None and self.process.is_alive():
                self.process.kill()
                self.process.join(JOIN_S)
            self.process = None


_shared: SharedHost | None = None


def share_host() -> SharedHost:
    """From now on this process's attempts share one tracker host process (what a worker
    does: ``services.worker.start``). Without it each attempt starts a host of its own, which
    exits once it has delivered (a library caller, the tracker bench)."""
    global _shared
    if _shared is None:
        _shared = SharedHost()
    return _shared


def unshare_host() -> None:
    """Back to a host per attempt; the shared one is stopped."""
    global _shared
    shared, _shared = _shared, None
    if shared is not None:
        shared.stop()


@contextlib.contextmanager
def without_main_module() -> Iterator[None]:
    """``spawn`` re-imports the parent's main module in the child (a bench script that imports
    torch, say); the host needs nothing of it, so the child is started with none."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main
