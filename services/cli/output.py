"""How the CLI shows things to people: tables that fit the terminal, times to the second,
numbers (NaN and infinities by name), sizes, durations, and epochs counted from 1.

The API counts epochs from 0 (the trainer's index); everything printed here counts from 1.

Nothing a user or a job wrote drives the terminal (issue 42 item 2): `main` runs every command
inside ``safe_terminal()``, which shows each control character other than newline and tab
escaped (ESC as ``\x1b``, as git and kubectl do) in everything printed to stdout and stderr;
rich's consoles come from ``console()``, which escapes the text and keeps rich's own styles
and cursor moves. Notes, names, paths, events, errors and a job's own output are all covered,
whichever command prints them.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sys
import textwrap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import IO, Any

from rich.console import Console
from rich.segment import Segment

# The terminal's width: $COLUMNS, else the terminal's own, else 80 (a pipe or a log).
DEFAULT_WIDTH = 80
GAP = "  "
ELLIPSIS = "…"


# C0 but newline and tab, DEL, and C1 (0x9b is a CSI on some terminals): shown as \xNN.
_ESCAPED = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7f, 0xa0)] if chr(code) not in "\n\t"}


def terminal_safe(text: str) -> str:
    """`text` with every control character other than newline and tab shown escaped:
    ``"\x1b]0;title\x07"`` prints as ``\x1b]0;title\x07``, inert."""
    return text.translate(_ESCAPED)


class SafeStream:
    """A text stream that writes everything `terminal_safe`; the rest is the stream's own."""

    def __init__(self, raw: IO[str]) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(terminal_safe(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def raw_stream(stream: IO[str] | SafeStream) -> IO[str]:
    return stream.raw if isinstance(stream, SafeStream) else stream


@contextlib.contextmanager
def safe_terminal() -> Iterator[None]:
    """stdout and stderr as `SafeStream`s while a command runs."""
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before


class SafeConsole(Console):
    """A rich Console that shows control characters in the text escaped, while its own styles
    and cursor moves (added after this, or control segments) reach the terminal as they are."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(terminal_safe(segment.text), segment.style)
            for segment in buffer
        )

    @property
    def file(self) -> IO[str]:
        return raw_stream(super().file)

    @file.setter
    def file(self, new_file: IO[str]) -> None:
        self._file = new_file


def console(*, stderr: bool = False) -> Console:
    """The console every rich output of the CLI goes through (`SafeConsole`)."""
    return SafeConsole(stderr=stderr, highlight=False)


def terminal_width() -> int:
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def hanging(head: str, text: str, width: int | None = None, indent: int | None = None) -> str:
    """`head` + `text` wrapped at word boundaries to `width` (the terminal's), the following
    lines indented under the text (or by `indent`): a wrapped line still reads as part of its
    entry, and no word is cut at the terminal's edge."""
    pad = " " * (len(head) if indent is None else indent)
    width = max(width or terminal_width(), len(pad) + 20)
    # A path or URL longer than the line stays whole: cut, it could not be copied.
    lines = textwrap.wrap(text, width, initial_indent=head, subsequent_indent=pad,
                          break_on_hyphens=False, break_long_words=False) if text else [head]
    return "\n".join(line.rstrip() for line in lines)


def table_lines(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, flex: str | None = None,
    width: int | None = None,
) -> list[str]:
    """Aligned columns. When they are wider than the terminal, the `flex` column (a name) is
    cut with an ellipsis, never below its header's width; other columns (ids, numbers) never."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    if flex is not None:
        index = list(headers).index(flex)
        total = sum(widths) + len(GAP) * (len(widths) - 1)
        over = total - (width or terminal_width())
        if over > 0:
            widths[index] = max(len(flex), widths[index] - over)
            rows = [
                [cut(c, widths[index]) if i == index else c for i, c in enumerate(r)] for r in rows
            ]
    return [
        GAP.join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *rows]
    ]


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, flex: str | None = None
) -> None:
    for line in table_lines(headers, rows, flex=flex):
        print(line)


def print_fields(fields: Sequence[tuple[str, str]]) -> None:
    """`key  value` lines; a long value wraps under itself instead of past the terminal."""
    key_width = max(len(k) for k, _ in fields)
    room = max(20, terminal_width() - key_width - len(GAP))
    indent = " " * (key_width + len(GAP))
    for key, value in fields:
        lines = textwrap.wrap(value, room, break_on_hyphens=False) or [""]
        print(f"{key.ljust(key_width)}{GAP}{lines[0]}".rstrip())
        for more in lines[1:]:
            print(f"{indent}{more}")


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + ELLIPSIS


def parse_time(timestamp: str | None) -> datetime | None:
    if not timestamp:
        return None
    moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def when(timestamp: str | None) -> str:
    """`2026-11-23 22:04:38` in local time, to the second; `-` when there is none."""
    moment = parse_time(timestamp)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def when_short(timestamp: str | None, now: datetime | None = None) -> str:
    """`11-23 22:04:38` this year, `2025-11-23 22:04` before (a table column)."""
    moment = parse_time(timestamp)
    if moment is None:
        return "-"
    local = moment.astimezone()
    this_year = (now or datetime.now(UTC)).astimezone().year == local.year
    return local.strftime("%m-%d %H:%M:%S" if this_year else "%Y-%m-%d %H:%M")


def number(value: Any, nonfinite: str | None = None) -> str:
    """A metric value: 6 significant digits, or its label when it is NaN or infinite (the API
    sends those as null with a `nonfinite` label beside them)."""
    if nonfinite:
        return nonfinite
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.6g}"


def point_value(point: Mapping[str, Any]) -> str:
    return number(point.get("value"), point.get("nonfinite"))


def latest_value(job: Mapping[str, Any], name: str) -> str:
    labels = job.get("nonfinite_metrics") or {}
    return number((job.get("latest_metrics") or {}).get(name), labels.get(name))


def epoch(index: Any) -> str:
    """The API's 0-based epoch index, counted from 1 for people."""
    return str(index + 1) if isinstance(index, int) else "-"


def size(num_bytes: Any) -> str:
    if not isinstance(num_bytes, int | float):
        return "-"
    value, unit = float(num_bytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


def duration(seconds: float) -> str:
    """`45 s`, `3 min 05 s`, `2 h 07 min`, `3 d 4 h`."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def grouped(value: int) -> str:
    """`1,437`: thousands separators for counts people compare."""
    return f"{value:,}"
