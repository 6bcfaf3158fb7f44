"""Where a job's `dataset.data_root` may point: inside an allowed root, nowhere else.

    roots = allowed_data_roots(settings)      # ACCUM_DATA_ROOTS (default <home>/data)
    reason = data_root_refusal("/datasets/mnist", roots)   # None, or why it is refused

A worker reads (and with `download: true` writes) the directory a job names, so a job could
otherwise read any file the worker can. The API refuses such a spec at submit (422 at
`body.dataset.data_root`; the allowed roots are listed to admins only, as they are paths of the
servers) and the worker checks again before it touches the data (a job stored earlier, or under
another allow-list, fails with the reason). Both read the same setting, ACCUM_DATA_ROOTS.

An ``s3://bucket/prefix`` data_root is allowed when it lies under an ``s3://`` entry of the
same list (no ``..`` parts): the worker checks it before it lists or downloads a single object
(its AWS credentials may read far more: other buckets, the checkpoints of every owner), syncs
it once into its node cache (``services.worker.datasets``) and reads it there, trusted as the
root it came from.

Rules: a local path must be absolute (a relative path or `~` would depend on the worker's working
directory or user); it is resolved (`..` removed, symlinks followed as far as they exist)
before it is compared, so `/datasets/../etc` and a link out of `/datasets` are both refused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from services.settings import Settings

log = logging.getLogger(__name__)

MAX_DATA_ROOT_LENGTH = 4096  # PATH_MAX on Linux


# A resolved local directory, or an s3://bucket/prefix URL (without the trailing slash).
DataRoot = Path | str


def allowed_data_roots(settings: Settings) -> list[DataRoot]:
    """ACCUM_DATA_ROOTS, local entries resolved; `<home>/data` when it is empty."""
    roots = settings.data_roots or [Path(settings.home) / "data"]
    return [root.rstrip("/") if isinstance(root, str) and is_s3(root) else Path(os.path.realpath(root))
            for root in roots]


def data_root_refusal(
    data_root: str, roots: Sequence[DataRoot], show_roots: bool = True
) -> str | None:
    """Why `data_root` is refused (a message that says what to do), or None when it lies
    inside one of `roots` (as `allowed_data_roots` returns them). The roots, and where a
    symlink leads, are named only with `show_roots` (an admin, a worker's log): they are the
    servers' paths."""
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
    if is_s3(data_root):
        parts = data_root.removeprefix("s3://").rstrip("/").split("/")
        if not parts[0] or any(p in (".", "..") for p in parts):
            return f"data_root {data_root!r} must be s3://bucket/prefix, without . or .. parts"
        if any(isinstance(root, str) and _s3_within(parts, root) for root in roots):
            return None
        return f"data_root {data_root!r} is outside the allowed data roots; {hint}"
    if not os.path.isabs(data_root):
        return f"data_root {data_root!r} is not an absolute path; {hint}"
    resolved = Path(os.path.realpath(data_root))
    if any(isinstance(root, Path) and resolved.is_relative_to(root) for root in roots):
        return None
    shown = f"{data_root!r}" if str(resolved) == data_root or not show_roots else f"{data_root!r} (= {resolved})"
    return f"data_root {shown} is outside the allowed data roots; {hint}"


def _s3_within(parts: list[str], root: str) -> bool:
    """Whether the bucket and key parts lie under the ``s3://bucket/prefix`` root, part by part
    (``s3://data/mnist`` does not cover ``s3://data/mnist-v2``)."""
    root_parts = [p for p in root.removeprefix("s3://").split("/") if p]
    return parts[: len(root_parts)] == root_parts


def is_s3(data_root: str | None) -> bool:
    return bool(data_root) and str(data_root).startswith("s3://")


class DataRootNotAllowed(ValueError):
    """A job's data_root outside the allowed roots: the worker fails the job with it."""


def require_allowed_data_root(data_root: str | None, settings: Settings) -> None:
    """The worker's check before it reads (or syncs) data; raises DataRootNotAllowed with a
    reason its owner may read (the job's error is no admin's view), after logging the one
    that names the allowed roots for the worker's operator."""
    if data_root is None:
        return
    if (reason := worker_refusal(data_root, allowed_data_roots(settings))) is not None:
        raise DataRootNotAllowed(reason)


def worker_refusal(path: str, roots: Sequence[DataRoot]) -> str | None:
    """A worker's `data_root_refusal`: the owner's reason (no roots named), after logging the
    one that names them for the worker's operator."""
    if (reason := data_root_refusal(path, roots, show_roots=False)) is not None:
        log.warning("refused a job's path: %s", data_root_refusal(path, roots))
    return reason
