"""Checkpoint records: add, list, find, and choose what to prune. A row holds its object's
``key`` (``<job>/<step>.pt``) in the artifact store, never a node's path.

Functions here flush but never commit. Upload the object first (complete and verified), then
its row, then commit; prune with ``delete_checkpoint_rows``, commit, then delete the objects. A
crash between the two leaves an object no row lists (``services.worker.checkpoints`` removes it
on resume), never a row without its object.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from services.jobdb.models import Checkpoint


def _score(checkpoint: Checkpoint, metric: str) -> float | None:
    value = (checkpoint.metrics or {}).get(metric)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def add_checkpoint(
    session: Session,
    job_id: str,
    step: int,
    key: str,
    size_bytes: int,
    sha256: str,
    epoch: int | None = None,
    metrics: dict[str, Any] | None = None,
    attempt: int = 0,
    best_by: str = "val_loss",
) -> Checkpoint:
    """Record a checkpoint (replacing a row for the same step: a resumed attempt rewrote it).

    ``is_best`` marks the one checkpoint with the lowest ``metrics[best_by]`` so far.
    Does not commit.
    """
    checkpoint = session.get(Checkpoint, (job_id, step))
    if checkpoint is None:
        checkpoint = Checkpoint(job_id=job_id, step=step)
        session.add(checkpoint)
    checkpoint.attempt = attempt
    checkpoint.epoch = epoch
    checkpoint.key = key
    checkpoint.size_bytes = size_bytes
    checkpoint.sha256 = sha256
    checkpoint.metrics = dict(metrics or {})
    checkpoint.is_best = False
    session.flush()
    _mark_best(session, job_id, best_by)
    return checkpoint


def _mark_best(session: Session, job_id: str, metric: str) -> None:
    scored = [
        (s, c.step)
        for c in list_checkpoints(session, job_id)
        if (s := _score(c, metric)) is not None
    ]
    best = min(scored)[1] if scored else None
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.job_id == job_id)
        .values(is_best=Checkpoint.step == best if best is not None else False)
        .execution_options(synchronize_session="fetch")
    )


def list_checkpoints(session: Session, job_id: str) -> list[Checkpoint]:
    """All checkpoints of a job, oldest step first."""
    query = select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
    return list(session.scalars(query))


def get_checkpoint(session: Session, job_id: str, step: int) -> Checkpoint | None:
    return session.get(Checkpoint, (job_id, step))


def checkpoints_to_prune(
    session: Session, job_id: str, keep_last: int, keep_best_by: str | None = "val_loss"
) -> list[Checkpoint]:
    """Checkpoints to delete so that the last ``keep_last`` remain, plus the best one by
    ``metrics[keep_best_by]`` (lowest). Oldest first. ``keep_last`` must be >= 1: the latest
    checkpoint is what a restart resumes from."""
    if keep_last < 1:
        raise ValueError(
            f"keep_last must be at least 1 (the latest is needed to resume), got {keep_last}"
        )
    checkpoints = list_checkpoints(session, job_id)
    keep = {c.step for c in checkpoints[-keep_last:]}
    if keep_best_by:
        scored = [(s, c.step) for c in checkpoints if (s := _score(c, keep_best_by)) is not None]
        if scored:
            keep.add(min(scored)[1])
    return [c for c in checkpoints if c.step not in keep]


def delete_checkpoint_rows(session: Session, job_id: str, steps: Iterable[int]) -> int:
    """Delete the rows of these steps (after their files are gone). Does not commit."""
    steps = list(steps)
    if not steps:
        return 0
    result = session.execute(
        delete(Checkpoint)
        .where(Checkpoint.job_id == job_id, Checkpoint.step.in_(steps))
        .execution_options(synchronize_session="fetch")
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
