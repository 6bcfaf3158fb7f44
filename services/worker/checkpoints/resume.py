"""Where an attempt's checkpoints come from and go to: ``checkpoint_uploads`` (this attempt's
uploader: the process's artifact store, this node's cache and staging directory) and
``prepare_resume`` (the store and the node made ready to resume; the checkpoint fetched),
called by node 0 through ``services.worker.launch``, ``fetch_resume_checkpoint`` (the fetch
alone: every other node of a gang); rank 0 uploads (a sharded model's
checkpoint: every rank its own files, ``shards``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from services.artifacts import ArtifactStore, ObjectMissing
from services.artifacts.cache import NodeCache
from services.jobdb.checkpoints import get_checkpoint, list_checkpoints
from services.jobdb.metrics import delete_metrics_after
from services.jobdb.status import resume_hint
from services.settings import Settings
from services.worker.attempt import Attempt
from services.worker.checkpoints.fetch import fetch_checkpoint
from services.worker.checkpoints.metrics import observe_fetch
from services.worker.checkpoints.orphans import remove_orphans
from services.worker.checkpoints.stores import artifact_store, node_cache
from services.worker.checkpoints.uploads import CheckpointUploads
from services.worker.heartbeat import Heartbeat


def checkpoint_uploads(settings: Settings, attempt: Attempt, heartbeat: Heartbeat | None) -> CheckpointUploads:
    """This attempt's uploader: the configured store, this node's cache and staging directory."""
    return CheckpointUploads(
        artifact_store(settings), node_cache(settings), attempt.job_id,
        retry_for_s=settings.lease_timeout_s,
        give_up=(lambda: heartbeat.lease_lost) if heartbeat is not None else (lambda: False),
    )


def prepare_resume(sessions: sessionmaker[Session], attempt: Attempt, store: ArtifactStore,
                   cache: NodeCache) -> Path | None:
    """Drop the metrics a predecessor logged after the checkpoint this attempt resumes from
    (all of them when it starts over), the objects no row lists (a predecessor killed between
    upload and row) and this node's staged files of the job; returns the local copy of the
    checkpoint to load (fetched into the node cache, sha256 checked; a sharded one's folder of
    every rank's files), if any. A checkpoint
    that cannot be fetched raises ``ArtifactStoreError``: a transient fault."""
    shutil.rmtree(cache.staging_dir(attempt.job_id), ignore_errors=True)
    if attempt.attempt == 1 and attempt.resume_step is None:
        # The job's first start: no predecessor logged a metric or stored an object, so there
        # is nothing to drop (a transaction and a store listing saved: issue 45).
        return None
    with sessions.begin() as session:
        delete_metrics_after(session, attempt.job_id, attempt.resume_step)
        listed = [c.step for c in list_checkpoints(session, attempt.job_id)]
    remove_orphans(store, attempt.job_id, listed)
    return fetch_resume_checkpoint(sessions, attempt, store, cache)


def fetch_resume_checkpoint(sessions: sessionmaker[Session], attempt: Attempt, store: ArtifactStore,
                            cache: NodeCache) -> Path | None:
    """The local copy of the checkpoint the attempt resumes from (None: it starts over), fetched
    into this node's cache; nothing in the store is changed. Every node of a gang fetches its
    own (node 0 through ``prepare_resume``)."""
    if attempt.resume_step is None:
        return None
    with sessions() as session:
        checkpoint = get_checkpoint(session, attempt.job_id, attempt.resume_step)
        key_sha = (checkpoint.key, checkpoint.sha256) if checkpoint is not None else None
    if key_sha is None:
        raise ObjectMissing(
            f"job {attempt.job_id} should resume from step {attempt.resume_step} but that "
            f"checkpoint has no record; {resume_hint(attempt.job_id)} again to restart from the latest one"
        )
    return observe_fetch(lambda: fetch_checkpoint(store, cache, key_sha[0], key_sha[1]))
