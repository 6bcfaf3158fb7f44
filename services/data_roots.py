"""Where a job's `dataset.data_root` may point: inside an allowed root, nowhere else.

    roots = allowed_data_roots(settings)      # ACCUM_DATA_ROOTS (default <home>/data)
    reason = data_root_refusal("/datasets/mnist", roots)   # None, or why it is refused

A worker reads (and with `download: true` writes) the directory a job names, so a job could
otherwise read any file the worker can. The API refuses such a spec at submit (422 at
`body.dataset.data_root`; the allowed roots are listed to admins only, as they are paths of the
servers) and the worker checks again before it touches the data (a job stored earlier, or under
another allow-list, fails with the reason). Both read the same setting, ACCUM_DATA_ROOTS.

Rules: the path must be absolute (a relative path or `~` would depend on the worker's working
directory or user); it is resolved (`..` removed, symlinks followed as far as they exist)
before it is compared, so `/datasets/../etc` and a link out of `/datasets` are both refused.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from services.settings import Settings

MAX_DATA_ROOT_LENGTH = 4096  # PATH_MAX on Linux


def allowed_data_roots(settings: Settings) -> list[Path]:
    """ACCUM_DATA_ROOTS, resolved; `<home>/data` when it is empty."""
    roots = settings.data_roots or [Path(settings.home) / "data"]
    return [Path(os.path.realpath(root)) for root in roots]


def data_root_refusal(
    data_root: str, roots: Sequence[Path], show_roots: bool = True
) -> str | None:
    """Why `data_root` is refused (a message that says what to do), or None when it lies
    inside one of `roots` (already resolved, as `allowed_data_roots` returns them). The roots
    are named only with `show_roots` (an admin, a worker's log): they are the servers' paths."""
    if show_roots:
        allowed = ", ".join(str(root) for root in roots)
        hint = f"use a directory inside one of: {allowed} (ACCUM_DATA_ROOTS)"
    else:
        hint = (
            "use a directory inside one of the data roots this service allows (ACCUM_DATA_ROOTS; "
            "an admin can tell you which), or leave data_root out for the default"
        )
    if "\x00" in data_root or len(data_root) > MAX_DATA_ROOT_LENGTH:
        return f"data_root must be at most {MAX_DATA_ROOT_LENGTH} characters, without NUL; {hint}"
    if not os.path.isabs(data_root):
        return f"data_root {data_root!r} is not an absolute path; {hint}"
    resolved = Path(os.path.realpath(data_root))
    if any(resolved.is_relative_to(root) for root in roots):
        return None
    shown = f"{data_root!r}" if str(resolved) == data_root else f"{data_root!r} (= {resolved})"
    return f"data_root {shown} is outside the allowed data roots; {hint}"


class DataRootNotAllowed(ValueError):
    """A job's data_root outside the allowed roots: the worker fails the job with it."""


def require_allowed_data_root(data_root: str | None, settings: Settings) -> None:
    """The worker's check before it reads data; raises DataRootNotAllowed with the reason."""
    if data_root is None:
        return
    if (reason := data_root_refusal(data_root, allowed_data_roots(settings))) is not None:
        raise DataRootNotAllowed(reason)
