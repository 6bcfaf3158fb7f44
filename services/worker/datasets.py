"""An ``s3://bucket/prefix`` data_root, synced once into the node's cache and read from there.

    local = synced_data_root(settings, "s3://datasets/mnist")   # <cache>/data/datasets/mnist

The first job on a node downloads every object under the prefix (into a temp directory,
renamed into place when complete, so a worker killed mid-sync leaves nothing half-synced that
another would trust); later jobs on the node reuse it without asking the store. A changed
dataset wants a new prefix (``.../mnist-v2``), as a checkpointed run must see the same data.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from services.artifacts import open_store
from services.data_roots import require_allowed_data_root

log = logging.getLogger(__name__)


def synced_data_root(settings: Any, data_root: str, owner: str | None = None) -> str:
    """The local directory holding ``data_root``'s objects (synced now if not yet); raises
    ``DataRootNotAllowed`` before it asks the store anything when ACCUM_DATA_ROOTS does not
    let ``owner`` (a name; None: everyone's roots only) read ``data_root``."""
    require_allowed_data_root(data_root, settings, owner)
    bucket_and_prefix = data_root.removeprefix("s3://").strip("/")
    local = settings.cache_path / "data" / bucket_and_prefix
    if local.is_dir():
        return str(local)
    store = open_store(f"s3://{bucket_and_prefix}")
    temp = local.parent / f".{local.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        objects = store.list()
        for stored in objects:
            store.get(stored.key, temp / stored.key)
        if not objects:
            raise FileNotFoundError(f"data_root {data_root} holds no objects; upload the dataset "
                                    "there, or fix the URL")
        try:
            os.rename(temp, local)
        except OSError:  # another worker on this node synced it meanwhile: theirs is as good
            if not local.is_dir():
                raise
        log.info("synced %d objects of %s into %s", len(objects), data_root, local)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return str(local)


def with_local_data_root(settings: Any, spec: Any, owner: str | None) -> Any:
    """The spec with an ``s3://`` data_root replaced by its synced local copy: a directory of
    this node's cache, outside ACCUM_DATA_ROOTS, trusted as the root it was synced from."""
    local = synced_data_root(settings, spec.dataset.data_root, owner)
    return spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"data_root": local})})


def named_as_synced(settings: Any, text: str) -> str:
    """``text`` (a job's error, its traceback, its output) with this node's synced copies named
    by the s3 root they came from, and the worker's own home directory (its caches:
    ``/root/.cache/huggingface/hub``) shown as ``~``: those paths are the server's, not for the
    job's owner."""
    text = text.replace(f"{settings.cache_path / 'data'}/", "s3://")
    home = os.path.expanduser("~")
    if len(Path(home).parts) > 1:  # a service user whose home is / keeps its paths
        text = text.replace(f"{home.rstrip('/')}/", "~/")
    return text
