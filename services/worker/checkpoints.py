"""A job's checkpoint files on disk, kept in step with its checkpoint rows.

A checkpoint is a file first (written atomically: temp file, fsync, rename) and a row second;
pruning deletes rows first and files after that commit. So a worker killed between the two
leaves a file that no row lists (or a temp file, when killed mid-write), never a row whose
file is gone. The next attempt of the job removes such files before it trains
(``remove_orphans``): it holds the lease, so no other writer works in the directory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from accumcore.checkpoint import temp_files

log = logging.getLogger(__name__)


def orphans(directory: Path, listed_steps: Iterable[int]) -> list[Path]:
    """Files in a job's checkpoint ``directory`` that no row lists: ``<step>.pt`` files of
    other steps, and temp files of interrupted writes. Other files are left alone."""
    if not directory.is_dir():
        return []
    listed = set(listed_steps)
    unlisted = [
        p for p in directory.glob("*.pt") if p.stem.isdigit() and int(p.stem) not in listed
    ]
    return sorted(unlisted) + temp_files(directory)


def remove_orphans(directory: Path, listed_steps: Iterable[int]) -> list[Path]:
    """Delete ``orphans(directory, listed_steps)``; returns them. A file that cannot be
    deleted (read-only disk) is logged and kept: it only wastes space."""
    removed = remove_files(orphans(directory, listed_steps))
    if removed:
        log.info("removed %d checkpoint files no row lists: %s", len(removed),
                 ", ".join(p.name for p in removed))
    return removed


def remove_files(paths: Iterable[Path]) -> list[Path]:
    """Delete checkpoint files (pruned ones after their rows' deletion committed, orphans);
    returns those deleted. One that cannot be deleted is logged and kept: the next attempt's
    ``remove_orphans`` tries again."""
    removed = []
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove checkpoint file %s: %s", path, exc)
            continue
        removed.append(path)
    return removed
