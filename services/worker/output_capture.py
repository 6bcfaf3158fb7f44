"""A job's own output, captured per attempt at the file-descriptor level.

    with captured_output(settings, job_id, attempt):   # around the attempt's training
        train(...)

For the attempt's duration this process's fds 1 and 2 are pipes: whatever writes there is
captured (``print``, C extensions, warnings, and the DDP ranks the attempt spawns, which
inherit the fds) and teed to the worker's own stdout/stderr, so operators still see it. Lines
go to ``job_logs`` (``services/jobdb/job_logs.py``) through ``log_sink.LogSink``: bounded per
attempt and per line, secrets of the worker's environment redacted.

Inside the process, ``print`` goes to fds 1/2 directly (not through Celery's stdout proxy,
which would add a log prefix), library log records (``transformers``, ``timm``, ``py.warnings``
...) go to fd 2 as ``LEVEL name: message`` and are captured; the worker's own records
(``services``, ``celery``, ``kombu`` ...: its reaper and registry threads log meanwhile, about
other jobs too) go to the operator's stream only, never into a job's logs.
"""

from __future__ import annotations

import logging
import os
import selectors
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from services.settings import Settings
from services.worker.log_sink import LineSplitter, LogSink

log = logging.getLogger(__name__)

STREAM_NAMES = {1: "stdout", 2: "stderr"}
# Loggers of the worker itself: kept out of jobs' logs (they are about the worker, not the job).
WORKER_LOGGERS = ("services", "celery", "kombu", "amqp", "billiard", "accum")
READ_BYTES = 65536
# How long the reader waits for ranks that still hold the pipes after the attempt ended.
DRAIN_S = 2.0


def is_worker_record(record: logging.LogRecord) -> bool:
    return record.name.split(".")[0] in WORKER_LOGGERS


class FdCapture:
    """Fds 1 and 2 replaced by pipes, read by a thread that tees to the saved originals and
    hands each stream's lines to ``sink``.

    A process the attempt started that outlives it (a helper some library keeps) still holds
    the pipes: the thread then goes on teeing its output to the operator alone until it exits
    (never leaving it writing into a closed pipe), and the job's lines end with the attempt."""

    def __init__(self, sink: LogSink, line_bytes: int) -> None:
        self.sink = sink
        self.saved: dict[int, int] = {}
        self.readers: dict[int, int] = {}
        self.splitters = {fd: LineSplitter(line_bytes) for fd in STREAM_NAMES}
        self.thread = threading.Thread(target=self._read, name="accum-output-capture", daemon=True)
        self.lock = threading.Lock()
        self.detached = False  # the attempt is over: lines no longer go to the job
        self.drained = False  # every writer closed the pipes and the thread is done with them

    def start(self) -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            _flush(stream)  # what was written before belongs to the worker, not the job
        for fd in STREAM_NAMES:
            self.saved[fd] = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)  # inheritable: spawned ranks write here too
            os.close(write_end)
            self.readers[fd] = read_end
        self.thread.start()

    def stop(self) -> None:
        for fd, original in self.saved.items():
            os.dup2(original, fd)  # our ends of the pipes close; ranks still alive hold theirs
        self.thread.join(DRAIN_S)
        with self.lock:
            if not self.drained:  # a child outlived the attempt: the thread closes later
                self._deliver_tails()
                self.detached = True
                return
        self._close()

    def original(self, fd: int) -> int:
        return self.saved[fd]

    def _read(self) -> None:
        selector = selectors.DefaultSelector()
        for fd, read_end in self.readers.items():
            selector.register(read_end, selectors.EVENT_READ, fd)
        open_ends = len(self.readers)
        while open_ends:
            for key, _ in selector.select(timeout=0.5):
                fd = key.data
                data = os.read(key.fd, READ_BYTES)
                if not data:  # every writer closed it
                    selector.unregister(key.fd)
                    open_ends -= 1
                    continue
                _write_all(self.saved[fd], data)
                with self.lock:
                    if not self.detached:
                        self.sink.add(STREAM_NAMES[fd], self.splitters[fd].feed(data))
        selector.close()
        with self.lock:
            self.drained = True
            if not self.detached:
                self._deliver_tails()
                return
        self._close()  # detached: stop() left the descriptors to this thread

    def _deliver_tails(self) -> None:
        """The last line of each stream when it had no newline."""
        for fd, splitter in self.splitters.items():
            self.sink.add(STREAM_NAMES[fd], splitter.end())

    def _close(self) -> None:
        for fd in (*self.saved.values(), *self.readers.values()):
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # the operator's terminal went away: the job's logs still get the lines
        pass


def _flush(stream: IO[Any] | None) -> None:
    try:
        if stream is not None:
            stream.flush()
    except (OSError, ValueError):
        pass


@contextmanager
def python_output_to_fds(operator_stderr: int) -> Iterator[None]:
    """``sys.stdout``/``sys.stderr`` as line-buffered files on fds 1/2, a handler writing the
    libraries' log records to fd 2, and the worker's own handlers writing only the worker's
    records, to the operator's stderr; all put back afterwards."""
    stdout, stderr = fd_file(1), fd_file(2)
    operator = open(operator_stderr, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    saved_streams = sys.stdout, sys.stderr
    capture_handler = logging.StreamHandler(stderr)
    capture_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    capture_handler.addFilter(lambda record: not is_worker_record(record))
    root = logging.getLogger()
    redirected: list[tuple[logging.StreamHandler[Any], Any]] = []
    for handler in root.handlers:
        if isinstance(handler, logging.StreamHandler) and _on_fd(handler.stream, (1, 2)):
            redirected.append((handler, handler.setStream(operator)))
            handler.addFilter(is_worker_record)
    if not redirected:  # no handler of the worker's own: its records still reach the operator
        own = logging.StreamHandler(operator)
        own.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        own.addFilter(is_worker_record)
        root.addHandler(own)
        redirected.append((own, None))
    # Spawned ranks are Python too: unbuffered, their lines arrive as they print them.
    unbuffered = os.environ.get("PYTHONUNBUFFERED")
    os.environ["PYTHONUNBUFFERED"] = "1"
    sys.stdout, sys.stderr = stdout, stderr
    root.addHandler(capture_handler)
    try:
        yield
    finally:
        root.removeHandler(capture_handler)
        sys.stdout, sys.stderr = saved_streams
        if unbuffered is None:
            os.environ.pop("PYTHONUNBUFFERED", None)
        else:
            os.environ["PYTHONUNBUFFERED"] = unbuffered
        for handler, stream in redirected:
            if stream is None:
                root.removeHandler(handler)
                continue
            handler.removeFilter(is_worker_record)
            handler.setStream(stream)
        for stream in (stdout, stderr):
            _flush(stream)  # left open: a library may keep it (fds 1/2 are the worker's again)
        operator.close()


_fd_files: dict[tuple[int, int], IO[str]] = {}


def fd_file(fd: int) -> IO[str]:
    """A line-buffered text file on ``fd``, one per process: a library that keeps the
    ``sys.stderr`` it saw during an attempt (a handler made then) writes there later too."""
    key = (os.getpid(), fd)
    if key not in _fd_files:
        _fd_files[key] = open(fd, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    return _fd_files[key]


def _on_fd(stream: Any, fds: tuple[int, ...]) -> bool:
    try:
        return int(stream.fileno()) in fds
    except (AttributeError, OSError, ValueError):
        return False


@contextmanager
def captured_output(settings: Settings, job_id: str, attempt: int) -> Iterator[None]:
    """Capture what the attempt prints into ``job_logs`` (see the module docstring)."""
    sink = LogSink(settings, job_id, attempt)
    capture = FdCapture(sink, settings.log_max_line_bytes + sink.redactor.longest)
    sink.start()
    try:
        capture.start()
    except OSError:  # no pipes left: the job runs uncaptured rather than not at all
        log.warning("job %s: its output is not captured (no file descriptors left)", job_id,
                    exc_info=True)
        sink.close()
        yield
        return
    try:
        with python_output_to_fds(capture.original(2)):
            yield
    finally:
        capture.stop()
        sink.close()
