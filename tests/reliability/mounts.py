"""Real file-system faults for the reliability tests: a small tmpfs that fills up for real,
remounted read-only on demand. Needs root (or CAP_SYS_ADMIN): without it the test is skipped
with the reason, or fails under ACCUM_REQUIRE_SERVICES=1."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skips import skip_or_fail

PAGE = 4096


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``path`` for the duration of the block."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = _mount("-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(path))
    if mounted.returncode != 0:
        reason = (f"cannot mount a tmpfs at {path} (run as root or with CAP_SYS_ADMIN): "
                  f"{mounted.stderr.strip()}")
        skip_or_fail(reason)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], capture_output=True, check=False)


def remount(path: Path, mode: str) -> None:
    """``mode``: ``ro`` or ``rw``."""
    result = _mount("-o", f"remount,{mode}", str(path))
    assert result.returncode == 0, f"mount -o remount,{mode} {path}: {result.stderr.strip()}"


def fill(path: Path, leave_bytes: int) -> Path:
    """Write a file on the file system of ``path`` so that only ``leave_bytes`` (rounded down
    to whole pages) stay free; returns it (delete it to free the space)."""
    stats = os.statvfs(path)
    free = stats.f_bavail * stats.f_frsize
    filler = path / "filler"
    filler.write_bytes(b"\0" * (max(free - leave_bytes, 0) // PAGE * PAGE))
    return filler
