"""A stored checkpoint into this node's cache, whatever its kind: ``fetch_checkpoint``.

    path = fetch_checkpoint(store, cache, row.key, row.sha256)

A file (``<job>/<step>.pt``) is fetched and its sha256 checked against the row's. A sharded
one (the row's key is ``<job>/<step>/manifest.json``) is read from its manifest: every file of
every rank is fetched (kept copies verified, others downloaded) into the cache's folder of the
step, which is then a checkpoint directory that ``accumcore.load_checkpoint`` reshards to this
attempt's world size. The manifest itself has no row sha256 to check against (the row's is the
consolidated file's, when there is one): a damaged one fails to parse or to match its files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.artifacts import ArtifactStore, ArtifactStoreError, ObjectMissing, is_sharded_key
from services.artifacts.cache import NodeCache


def fetch_checkpoint(store: ArtifactStore, cache: NodeCache, key: str, sha256: str | None = None,
                     files: dict[str, dict[str, Any]] | None = None) -> Path:
    """The local copy of the checkpoint at ``key``: a file, or a sharded checkpoint's folder.
    ``files``: a sharded one's manifest entries, when the caller has them. Raises the store's
    errors (``ObjectMissing`` for a manifest that names no files)."""
    if not is_sharded_key(key):
        assert sha256 is not None
        return cache.fetch(store, key, sha256)
    if files is None:
        files = read_manifest(store, cache, key)["files"]
    folder = cache.path_for(key).parent
    for name, facts in files.items():
        cache.fetch(store, f"{key.rsplit('/', 1)[0]}/{name}", str(facts["sha256"]))
    evicted = sorted(name for name in files if not (folder / name).is_file())
    if evicted:
        raise ArtifactStoreError(
            f"{key}: the node cache ({cache.root}) evicted {', '.join(evicted)} while fetching the "
            "checkpoint's other files; raise ACCUM_CACHE_MAX_BYTES above the checkpoint's size"
        )
    return folder


def read_manifest(store: ArtifactStore, cache: NodeCache, key: str) -> dict[str, Any]:
    """A sharded checkpoint's manifest, downloaded into the cache (a small file, always fresh)."""
    path = cache.path_for(key)
    store.get(key, path, None)
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as exc:
        path.unlink(missing_ok=True)
        raise ObjectMissing(f"{key} in {store.url} is not a sharded checkpoint's manifest ({exc}); "
                            "resume from another checkpoint") from exc
    if not isinstance(files, dict) or not files:
        raise ObjectMissing(f"{key} in {store.url} lists no files; resume from another checkpoint")
    return dict(manifest)
