"""Every file a dataset (or a saved model) opens stays inside its data_root (torch-free).

    check_links(Path("/data/bob/images"))                          # before ImageFolder walks it
    inside(Path("/data/bob/text"), "train.csv", "data file")       # -> the resolved path

The API and the worker check only `data_root` itself against the allowed roots
(`services.data_roots`); the files under it were opened as they came. The audit of 2026-11
(issue 25, item 2) put `data/bob/env.csv -> /proc/self/environ` in a data root, and the job's
error and events carried the worker's AWS_SECRET_ACCESS_KEY. So each path is resolved (symlinks
followed, `..` removed) and must lie inside the resolved data_root: a link that leaves it is
refused even when it points into another allowed root, since only data_root was checked. The
refusal names the path as the owner wrote it (relative to data_root), never the link's target
nor anything read from the file.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_SHOWN = 200  # characters of a path from the data (an image column's path) in a message


class OutsideDataRoot(ValueError):
    """A file a dataset would open lies outside its data_root: the job fails with this."""


def _refusal(what: str, shown: str) -> OutsideDataRoot:
    return OutsideDataRoot(
        f"{what} {shown[:MAX_SHOWN]!r} leads outside data_root (a symlink or an absolute path that "
        "leaves it); every file a dataset reads must lie inside data_root: copy the file in "
        "instead of linking to it"
    )


def inside(root: Path, path: str | Path, what: str) -> Path:
    """`root / path` resolved; OutsideDataRoot unless it lies inside `root` (resolved)."""
    base = Path(os.path.realpath(root))
    resolved = Path(os.path.realpath(base / path))
    if not resolved.is_relative_to(base):
        raise _refusal(what, str(path))
    return resolved


def check_links(root: Path, what: str = "data file", under: str = ".") -> None:
    """Walk `root / under`, following the links that stay inside `root` (each directory once,
    so a link loop ends), and raise OutsideDataRoot at the first link that leaves it. Before a
    reader that walks the tree itself (ImageFolder, `load_from_disk`, torchvision,
    `from_pretrained`)."""
    base = Path(os.path.realpath(root))
    start = inside(base, under, what)
    if not start.is_dir():
        return  # the reader says what is missing
    seen: set[Path] = set()
    pending = [start]
    while pending:
        directory = pending.pop()
        if directory in seen:
            continue
        seen.add(directory)
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_symlink():
                    target = Path(os.path.realpath(entry.path))
                    if not target.is_relative_to(base):
                        raise _refusal(what, os.path.relpath(entry.path, base))
                    if target.is_dir():
                        pending.append(target)
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
