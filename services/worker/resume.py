"""Where an attempt's checkpoints come from and go to: ``checkpoint_uploads`` (this attempt's
uploader: the configured artifact store, this node's cache and staging directory) and
``prepare_resume`` (the store and the node made ready to resume; the checkpoint fetched).
Used by the single-process training and by the DDP ranks."""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from services.artifacts import ArtifactStore, ObjectMissing, open_store
from services.artifacts.cache import NodeCache
from services.settings import Settings
from services.store.checkpoints import get_checkpoint, list_checkpoints
from services.store.metrics import delete_metrics_after
from services.store.status import resume_hint
from services.worker.attempt import Attempt
from services.worker.cache_sweep import job_exists
from services.worker.checkpoints import remove_orphans
from services.worker.heartbeat import Heartbeat
from services.worker.store_metrics import observe_fetch
from services.worker.uploads import CheckpointUploads


def checkpoint_uploads(settings: Settings, attempt: Attempt, heartbeat: Heartbeat | None) -> CheckpointUploads:
    """This attempt's uploader: the configured store, this node's cache and staging directory."""
    return CheckpointUploads(
        open_store(settings.artifacts_url), node_cache(settings), attempt.job_id,
        retry_for_s=settings.lease_timeout_s,
        give_up=(lambda: heartbeat.lease_lost) if heartbeat is not None else (lambda: False),
    )


def node_cache(settings: Settings) -> NodeCache:
    # A job deleted since its row was read is not served from here (services.worker.cache_sweep).
    return NodeCache(settings.cache_path, settings.cache_max_bytes, job_exists=job_exists(settings))


def prepare_resume(sessions: sessionmaker[Session], attempt: Attempt, store: ArtifactStore,
                   cache: NodeCache) -> Path | None:
    """Drop the metrics a predecessor logged after the checkpoint this attempt resumes from
    (all of them when it starts over), the objects no row lists (a predecessor killed between
    upload and row) and this node's staged files of the job; returns the local copy of the
    checkpoint to load (fetched into the node cache, sha256 checked), if any. A checkpoint
    that cannot be fetched raises ``ArtifactStoreError``: a transient fault."""
    shutil.rmtree(cache.staging_dir(attempt.job_id), ignore_errors=True)
    with sessions.begin() as session:
        delete_metrics_after(session, attempt.job_id, attempt.resume_step)
        listed = [c.step for c in list_checkpoints(session, attempt.job_id)]
        checkpoint = (get_checkpoint(session, attempt.job_id, attempt.resume_step)
                      if attempt.resume_step is not None else None)
        key_sha = (checkpoint.key, checkpoint.sha256) if checkpoint is not None else None
    remove_orphans(store, attempt.job_id, listed)
    if attempt.resume_step is None:
        return None
    if key_sha is None:
        raise ObjectMissing(
            f"job {attempt.job_id} should resume from step {attempt.resume_step} but that "
            f"checkpoint has no record; {resume_hint(attempt.job_id)} again to restart from the latest one"
        )
    return observe_fetch(lambda: cache.fetch(store, key_sha[0], key_sha[1]))
