"""Where captured output goes: lines split as a terminal shows them, bounded, redacted, and
written to ``job_logs`` in batches by a thread (``services/worker/output_capture.py`` feeds it).

Bounds per attempt: ``ACCUM_LOG_MAX_LINES_PER_ATTEMPT`` lines (the first ones are kept; one
``accum`` line says when the rest start being dropped and, at the end, how many were), each
line cut at ``ACCUM_LOG_MAX_LINE_BYTES`` with a note giving its full length. A carriage return
overwrites the line (a progress bar is stored as its last state, not as a thousand lines).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping

from services.jobdb.job_logs import add_lines
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker.redaction import Redactor

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 0.5
_BREAKS = re.compile(rb"(\r\n|\n|\r)")


class LineSplitter:
    """Bytes in, ``(first bytes of the line, its full length)`` out; keeps at most ``keep``
    bytes of a line, however long it grows."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.buffer = bytearray()
        self.total = 0
        self.carriage_return = False

    def feed(self, data: bytes) -> list[tuple[bytes, int]]:
        lines: list[tuple[bytes, int]] = []
        for piece in _BREAKS.split(data):
            if not piece:
                continue
            if piece in (b"\n", b"\r\n"):
                lines.append(self._take())
            elif piece == b"\r":
                self.carriage_return = True
            else:
                if self.carriage_return:  # overwrite, as a terminal does
                    self.buffer.clear()
                    self.total = 0
                room = self.keep - len(self.buffer)
                self.buffer += piece[:max(room, 0)]
                self.total += len(piece)
            if piece != b"\r":
                self.carriage_return = False
        return lines

    def end(self) -> list[tuple[bytes, int]]:
        """The last line when it had no newline."""
        return [self._take()] if self.buffer or self.total else []

    def _take(self) -> tuple[bytes, int]:
        line = (bytes(self.buffer), self.total)
        self.buffer.clear()
        self.total = 0
        self.carriage_return = False
        return line


class LogSink:
    """One attempt's lines, bounded and redacted, written to the job store by a thread."""

    def __init__(self, settings: Settings, job_id: str, attempt: int,
                 environ: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.job_id, self.attempt = job_id, attempt
        self.redactor = Redactor.of_worker(settings, os.environ if environ is None else environ)
        self.max_lines = settings.log_max_lines_per_attempt
        self.max_bytes = settings.log_max_line_bytes
        self.kept = self.dropped = 0
        self.pending: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._run, name="accum-log-sink", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def add(self, stream: str, lines: list[tuple[bytes, int]]) -> None:
        with self.lock:
            for raw, total in lines:
                if self.kept >= self.max_lines:
                    self.dropped += 1
                    if self.dropped == 1:
                        self.pending.append(("accum", (
                            f"[accum] this attempt printed more than {self.max_lines} lines "
                            "(ACCUM_LOG_MAX_LINES_PER_ATTEMPT): later lines are dropped; "
                            "the worker's own output still shows them")))
                    continue
                self.kept += 1
                self.pending.append((stream, self.render(raw, total)))

    def render(self, raw: bytes, total: int) -> str:
        """The stored line: secrets redacted, then cut at the bound with a note."""
        text = self.redactor(raw.decode("utf-8", "replace"))
        encoded = text.encode("utf-8")
        if len(encoded) <= self.max_bytes and total <= len(raw):
            return text
        cut = encoded[:self.max_bytes].decode("utf-8", "ignore")
        return (f"{cut} [accum: line cut at {self.max_bytes} bytes "
                f"(ACCUM_LOG_MAX_LINE_BYTES); it had {total}]")

    def close(self) -> None:
        """Stop the thread and write what is left (with the count of dropped lines)."""
        self.closed.set()
        if self.thread.is_alive():
            self.thread.join()
        with self.lock:
            if self.dropped:
                self.pending.append(("accum", (
                    f"[accum] {self.dropped} more lines were dropped "
                    f"(ACCUM_LOG_MAX_LINES_PER_ATTEMPT = {self.max_lines})")))
        if not self._flush():
            log.warning("job %s attempt %d: %d captured lines could not be stored",
                        self.job_id, self.attempt, len(self.pending))

    def _run(self) -> None:
        while not self.closed.wait(FLUSH_EVERY_S):
            self._flush()

    def _flush(self) -> bool:
        with self.lock:
            batch, self.pending = self.pending, []
        if not batch:
            return True
        try:
            with session_factory(self.settings).begin() as session:
                add_lines(session, self.job_id, self.attempt, batch)
            return True
        except Exception:  # a database outage: kept (bounded above) for the next try
            log.warning("job %s: storing %d output lines failed; retried", self.job_id,
                        len(batch), exc_info=True)
            with self.lock:
                self.pending[:0] = batch
            return False
