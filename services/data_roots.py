"""Where a job may read: inside a data root its owner may read, nowhere else.

    roots = reader_roots(settings, "bob")            # ACCUM_DATA_ROOTS as bob may read them
    reason = data_root_refusal("/datasets/mnist", roots)   # None, or why it is refused

A worker reads (and with `download: true` writes) the directory a job names, so a job could
otherwise read any file the worker can. The API refuses such a spec at submit (422 at
`body.dataset.data_root`; the allowed roots are listed to admins only, as they are paths of the
servers) and the worker checks again before it touches the data (a job stored earlier, or under
another allow-list, fails with the reason). Both read the same setting, ACCUM_DATA_ROOTS.

Owners (issue 42): an entry may name who reads under it (`alice:/data/alice`, a group
`alice,bob:/data/team`) or hold `{owner}` (`/data/users/{owner}`: each owner's own folder); a
plain entry (`/datasets`) is everyone's, as every entry was before owners. Where roots nest, the
deepest root that holds a path decides: with `["/data", "/data/users/{owner}"]` everyone reads
`/data/shared`, and `/data/users/alice` is alice's alone. The refusal never depends on what is
on disk beyond the links on the way: another owner's file and a missing one get one message.

An ``s3://bucket/prefix`` data_root is allowed when it lies under an ``s3://`` entry of the
same list (no ``..`` parts): the worker checks it before it lists or downloads a single object
(its AWS credentials may read far more: other buckets, the checkpoints of every owner), syncs
it once into its node cache (``services.worker.datasets``) and reads it there, trusted as the
root it came from.

Rules: a local path must be absolute (a relative path or `~` would depend on the worker's working
directory or user). It is checked twice, and both forms must be readable: as written (`..`
removed, no link followed) and resolved (symlinks followed as far as they exist). So
`/datasets/../etc`, a link out of `/datasets`, a link of bob's into alice's folder and a link of
alice's that bob names are all refused.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.data_root_entries import OWNER, OWNER_NAME, DataRootEntry
from services.settings import Settings

log = logging.getLogger(__name__)

MAX_DATA_ROOT_LENGTH = 4096  # PATH_MAX on Linux


# A resolved local directory, or an s3://bucket/prefix URL (without the trailing slash).
DataRoot = Path | str


def data_root_entries(settings: Settings) -> tuple[DataRootEntry, ...]:
    """ACCUM_DATA_ROOTS parsed (the settings validated them); `<home>/data` for everyone when empty."""
    roots = settings.data_roots or [Path(settings.home) / "data"]
    return tuple(DataRootEntry.parse(root) if isinstance(root, str) else DataRootEntry(str(root))
                 for root in roots)


def allowed_data_roots(settings: Settings) -> list[DataRoot]:
    """Every root of ACCUM_DATA_ROOTS, whoever may read it: local ones resolved (up to a
    `{owner}` part), s3 ones without the trailing slash."""
    return [_resolved(entry.root) for entry in data_root_entries(settings)]


def configured_data_roots(settings: Settings) -> list[str]:
    """ACCUM_DATA_ROOTS as an admin reads it (GET /v1/me): each entry with its owners, its root
    resolved."""
    return [entry.written(str(_resolved(entry.root))) for entry in data_root_entries(settings)]


@dataclass(frozen=True)
class ReaderRoots:
    """The data roots as one owner (`reader`) may read them. Every entry is kept, not only the
    reader's: a deeper root of another owner refuses a path under a root everyone reads."""

    entries: tuple[DataRootEntry, ...]
    reader: str | None = None  # None: only everyone's plain roots are readable

    @classmethod
    def everyone(cls, roots: Iterable[DataRoot]) -> ReaderRoots:
        """Plain roots (the format before owners), e.g. `allowed_data_roots`'s."""
        return cls(tuple(DataRootEntry(str(root)) for root in roots))

    def readable(self) -> list[DataRoot]:
        """The roots the reader may read under (`{owner}` filled in), resolved: an admin's hint."""
        roots: list[DataRoot] = []
        for entry in self.entries:
            if OWNER in entry.root and not _is_owner_name(self.reader):
                continue
            if entry.owners is None or self.reader in entry.owners:
                roots.append(_resolved(entry.root.replace(OWNER, self.reader or OWNER)))
        return roots

    def allows(self, parts: Sequence[str], s3: bool) -> bool:
        """Whether the deepest roots holding `parts` (a path's parts, or an s3 URL's bucket and
        key parts) let the reader read there."""
        deepest, granted = -1, False
        for entry in self.entries:
            if entry.is_s3 != s3:
                continue
            for form in _forms(entry):
                if len(form) > len(parts) and not self._may_read_below(entry, form, parts):
                    return False  # a folder holding another owner's root: all of it is read
                if (found := _match(form, parts)) is None:
                    continue
                depth, name = found
                grants = (entry.owners is None or self.reader in entry.owners) \
                    and (name is None or name == self.reader)
                if depth > deepest:
                    deepest, granted = depth, grants
                elif depth == deepest:
                    granted = granted or grants
        return granted


    def _may_read_below(self, entry: DataRootEntry, form: Sequence[str], parts: Sequence[str]) -> bool:
        """Whether the reader may read all of `entry`'s roots that lie under `parts` (True when
        none does)."""
        if (found := _match(form[:len(parts)], parts)) is None:
            return True
        if entry.owners is not None and self.reader not in entry.owners:
            return False
        name = found[1]
        if any(OWNER in part for part in form[len(parts):]):  # every owner's folder is below
            return name in (None, self.reader) and entry.owners == frozenset({self.reader})
        return name in (None, self.reader)


def reader_roots(settings: Settings, owner: str | None) -> ReaderRoots:
    """ACCUM_DATA_ROOTS as `owner` (a name) may read them."""
    return ReaderRoots(data_root_entries(settings), owner)


def _is_owner_name(name: str | None) -> bool:
    # "." and ".." are owner names, but /data/{owner} must never become /data or /.
    return name is not None and name not in (".", "..") and re.fullmatch(OWNER_NAME, name) is not None


def _resolved(root: str) -> DataRoot:
    """A local root resolved up to its first `{owner}` part; an s3 root without the trailing /."""
    if root.startswith("s3://"):
        return root.rstrip("/")
    parts = Path(root).parts
    fixed = next((i for i, part in enumerate(parts) if OWNER in part), len(parts))
    resolved = Path(os.path.realpath(Path(*parts[:fixed]) if fixed else "."))
    return resolved.joinpath(*parts[fixed:])


def _forms(entry: DataRootEntry) -> list[tuple[str, ...]]:
    """The parts a path is compared with: an s3 root's bucket and prefix; a local root as
    written (normalised) and resolved (a path may be named either way)."""
    if entry.is_s3:
        return [tuple(p for p in entry.root.removeprefix("s3://").split("/") if p)]
    written = Path(os.path.normpath(entry.root)).parts
    resolved = Path(_resolved(entry.root)).parts
    return [written] if written == resolved else [written, resolved]


def _match(template: Sequence[str], parts: Sequence[str]) -> tuple[int, str | None] | None:
    """(depth, the owner named by its `{owner}` part or None) when `parts` lie under the
    root's `template` parts; None when they do not."""
    if len(parts) < len(template):
        return None
    name: str | None = None
    for want, part in zip(template, parts, strict=False):
        if OWNER not in want:
            if want != part:
                return None
            continue
        head, tail = want.split(OWNER)
        got = part[len(head):len(part) - len(tail)] if part.startswith(head) and part.endswith(tail) else ""
        if len(part) < len(head) + len(tail) or not _is_owner_name(got) or name not in (None, got):
            return None
        name = got
    return len(template), name


def data_root_refusal(
    data_root: str, roots: ReaderRoots | Sequence[DataRoot], show_roots: bool = True
) -> str | None:
    """Why `data_root` is refused (a message that says what to do), or None when it lies
    where the reader of `roots` may read (a plain list: everyone's roots). The roots, and
    where a symlink leads, are named only with `show_roots` (an admin, a worker's log): they
    are the servers' paths. The message is the same whether the path exists or not."""
    view = roots if isinstance(roots, ReaderRoots) else ReaderRoots.everyone(roots)
    if show_roots:
        allowed = ", ".join(str(root) for root in view.readable()) or "none"
        hint = f"use a directory inside one of: {allowed} (ACCUM_DATA_ROOTS)"
    else:
        hint = (
            "use a directory inside one of the data roots this service allows you (ACCUM_DATA_ROOTS; "
            "an admin can tell you which), or leave data_root out for the default"
        )
    if "\x00" in data_root or len(data_root) > MAX_DATA_ROOT_LENGTH:
        return f"data_root must be at most {MAX_DATA_ROOT_LENGTH} characters, without NUL; {hint}"
    if is_s3(data_root):
        parts = data_root.removeprefix("s3://").rstrip("/").split("/")
        if not parts[0] or any(p in (".", "..") for p in parts):
            return f"data_root {data_root!r} must be s3://bucket/prefix, without . or .. parts"
        if view.allows([p for p in parts if p], s3=True):
            return None
        return f"data_root {data_root!r} is outside the allowed data roots; {hint}"
    if not os.path.isabs(data_root):
        return f"data_root {data_root!r} is not an absolute path; {hint}"
    # The path as written first, without touching the disk: another owner's path, or a missing one
    # under another owner's folder, is refused before anything is looked up, so the refusal takes
    # the same time whether it exists (resolving an existing path was 1-3 us faster, of ~75).
    if view.allows(Path(os.path.normpath(data_root)).parts, s3=False):
        if view.allows(Path(os.path.realpath(data_root)).parts, s3=False):
            return None
    elif not show_roots:
        return f"data_root {data_root!r} is outside the allowed data roots; {hint}"
    resolved = os.path.realpath(data_root)
    shown = f"{data_root!r}" if resolved == data_root or not show_roots else f"{data_root!r} (= {resolved})"
    return f"data_root {shown} is outside the allowed data roots; {hint}"


def is_s3(data_root: str | None) -> bool:
    return bool(data_root) and str(data_root).startswith("s3://")


class DataRootNotAllowed(ValueError):
    """A job's data_root outside the roots its owner may read: the worker fails the job with it."""


def require_allowed_data_root(data_root: str | None, settings: Settings, owner: str | None) -> None:
    """The worker's check before it reads (or syncs) data for `owner`'s job; raises
    DataRootNotAllowed with a reason its owner may read (the job's error is no admin's view),
    after logging the one that names the allowed roots for the worker's operator."""
    if data_root is None:
        return
    if (reason := worker_refusal(data_root, reader_roots(settings, owner))) is not None:
        raise DataRootNotAllowed(reason)


def worker_refusal(path: str, roots: ReaderRoots | Sequence[DataRoot]) -> str | None:
    """A worker's `data_root_refusal`: the owner's reason (no roots named), after logging the
    one that names them for the worker's operator."""
    if (reason := data_root_refusal(path, roots, show_roots=False)) is not None:
        log.warning("refused a job's path: %s", data_root_refusal(path, roots))
    return reason
