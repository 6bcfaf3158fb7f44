"""Checkpoint files: atomic writes (temp file, fsync, rename, fsync dir) and loading.

A reader never sees a half-written file: the bytes go to a temporary file in the same
directory, are fsynced, and the file is renamed over the final name (atomic on POSIX); the
directory is fsynced so the rename itself survives a power cut. A failed write (disk full,
read-only directory) removes its temporary file and raises ``CheckpointWriteError``; a
process killed mid-write leaves one behind, which ``temp_files`` finds.

``fsync=False`` keeps the temp file and the rename (a reader still sees the old file or the
whole new one) but not the power-cut guarantee: for a file that is only a staged copy, whose
durable copy is made elsewhere (the accum worker uploads it to its artifact store, which
syncs its own copy), the two fsyncs are most of the trainer's time per checkpoint.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from accumcore.callbacks import CheckpointInfo

TEMP_SUFFIX = ".tmp"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, directory not writable); the files
    written before it are untouched. ``errno`` is the cause's."""

    @classmethod
    def of(cls, errno: int | None, message: str) -> CheckpointWriteError:
        """The error with ``message`` (as ``strerror``) and the cause's ``errno``, if any."""
        return cls(errno, message) if errno else cls(message)


def temp_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Temporary files that writers killed mid-write left in ``directory`` (safe to delete
    once no writer runs there)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(TEMP_SUFFIX))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either the old or the new content
    (after a power cut too, unless ``fsync`` is False)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(target.parent)


def fsync_dir(directory: Path) -> None:
    """Make the names in ``directory`` (a rename into it) durable; a no-op where directories
    cannot be opened."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories; the rename is still atomic
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def save_checkpoint(
    state: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    metrics: dict[str, float] | None = None,
    fsync: bool = True,
) -> CheckpointInfo:
    """Serialise ``state`` with ``torch.save`` and write it atomically to ``path``
    (``fsync=False``: without the power-cut guarantee, see the module's docstring).

    ``step`` and ``epoch`` of the returned info come from ``state["progress"]`` when present
    (as in ``Trainer.state_dict()``).

    Raises:
        CheckpointWriteError: the file could not be written; ``path`` keeps its old content.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    try:
        atomic_write_bytes(path, data, fsync=fsync)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        culprit = str(exc.filename or path)
        if culprit != str(path) and not culprit.endswith(TEMP_SUFFIX):
            reason = f"{reason}: {culprit}"  # e.g. a file where the directory should be
        message = (
            f"could not write checkpoint {path}: {reason}; free space on that disk or make the "
            "directory writable (the checkpoints written before are untouched)"
        )
        raise CheckpointWriteError.of(exc.errno, message) from exc
    progress = state.get("progress", {}) if isinstance(state, dict) else {}
    return CheckpointInfo(
        path=Path(path),
        step=int(progress.get("step", 0)),
        epoch=int(progress.get("epoch", 0)),
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        metrics=dict(metrics or {}),
    )


def load_checkpoint(
    path: str | os.PathLike[str], *, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Load a checkpoint written by ``save_checkpoint`` (tensors land on ``map_location``).

    Trainer states hold only tensors and plain Python values, so the safe
    ``weights_only=True`` loader is used.
    """
    target = Path(path)
    if not target.is_file():
        raise FileNotFoundError(
            f"checkpoint {target} does not exist; pass the path of a <step>.pt file "
            "written by the trainer's checkpoint_dir"
        )
    state = torch.load(target, map_location=map_location, weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {target} does not hold a dict (got {type(state).__name__})")
    return state
