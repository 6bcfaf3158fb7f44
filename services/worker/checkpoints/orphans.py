"""A job's checkpoint objects in the artifact store, kept in step with its checkpoint rows.

A checkpoint is an object first (complete and verified: ``services.worker.checkpoints.uploads``) and a row
second; pruning deletes rows first and objects after that commit. So a worker killed between
the two leaves an object that no row lists (or, on a local store, a temp file of a put cut
short; on S3 an incomplete multipart upload, which is invisible and which a bucket lifecycle
rule aborts), never a row whose object is gone. The next attempt of the job removes such
objects before it trains (``remove_orphans``): it holds the lease, so no other writer works
under the job's prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from services.artifacts import ArtifactStore, ArtifactStoreError, LocalStore
from services.worker.checkpoints.metrics import count_error

log = logging.getLogger(__name__)


def orphans(store: ArtifactStore, job_id: str, listed_steps: Iterable[int]) -> list[str]:
    """Keys under ``<job>/`` that no row lists: ``<step>.pt`` objects and the objects of
    sharded checkpoints' folders ``<step>/`` of other steps. Other objects are left alone."""
    listed = {str(step) for step in listed_steps}
    return [o.key for o in store.list(f"{job_id}/")
            if (step := _step_of(o.key[len(job_id) + 1:])).isdigit() and step not in listed]


def _step_of(name: str) -> str:
    """The step of a checkpoint object's name under its job: ``<step>.pt``, ``<step>/<file>``."""
    if "/" in name:
        return name.split("/", 1)[0]
    return name.removesuffix(".pt") if name.endswith(".pt") else ""


def remove_orphans(store: ArtifactStore, job_id: str, listed_steps: Iterable[int]) -> list[str]:
    """Delete ``orphans(...)`` (and a local store's temp files under the job); returns the keys.
    An object that cannot be deleted is logged and kept: it only wastes space."""
    removed = []
    for key in orphans(store, job_id, listed_steps):
        try:
            store.delete(key)
        except ArtifactStoreError as exc:
            count_error("delete", exc)
            log.warning("could not remove orphan checkpoint %s: %s", key, exc)
            continue
        removed.append(key)
    if isinstance(store, LocalStore):
        store.remove_temp_files(job_id)
    if removed:
        log.info("removed %d checkpoint objects no row lists: %s", len(removed), ", ".join(removed))
    return removed
