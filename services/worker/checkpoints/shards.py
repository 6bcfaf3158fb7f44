"""A sharded (FSDP) checkpoint into the artifact store, every rank storing its own files:
``ShardedUploads``.

    shards = ShardedUploads(uploads, rank, gather=side_gather(timeout_s), consolidate_max_bytes=n)
    shards.submit(step, files)            # ranks > 0: their DCP files
    shards.submit(step, files, record)    # rank 0: its files, .metadata and trainer.pt; then the row

In the background (``CheckpointUploads.background``, one checkpoint in flight per rank) each
rank puts its files at ``<job>/<step>/<name>`` and moves them into its node's cache, then every
rank's outcome is gathered over a gloo group of its own (``side_gather``: the training
collectives go on meanwhile on the default group). If any rank failed, every rank raises and
no row is written; otherwise rank 0 writes ``consolidated.pt`` when the shards total at most
``consolidate_max_bytes`` (``ACCUM_CONSOLIDATE_MAX_BYTES``: it holds the full state in host
memory), then ``manifest.json`` (every file's size and sha256), then the row through
``record``: its key the manifest's, its size that of every object of the step (quota and
retention count them all), its sha256 the consolidated file's (what a download serves and the
client checks) or, with none, the manifest's.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from services.artifacts import CONSOLIDATED, ObjectInfo, consolidated_key, manifest_key, sha256_of
from services.worker.checkpoints.fetch import fetch_checkpoint
from services.worker.checkpoints.uploads import CheckpointUploads, Record

MANIFEST_FORMAT = 1
# Every rank's outcome of one checkpoint, in rank order (a collective over the ranks).
Gather = Callable[[Any], list[Any]]


class ShardUploadFailed(RuntimeError):
    """A rank could not store its shards: the checkpoint has no row (a transient fault: the
    next attempt resumes from the previous one)."""


def side_gather(timeout_s: float) -> Gather:
    """``all_gather_object`` over a new gloo group of every rank (a collective: call it on
    every rank at the same point), for the upload threads: their collectives never interleave
    with the training's on the default group."""
    import torch.distributed as dist  # lazy: only ranks in a process group get here

    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    assert isinstance(group, dist.ProcessGroup)  # every rank is a member

    def gather(value: Any) -> list[Any]:
        found: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(found, value, group=group)
        return found

    return gather


class ShardedUploads:
    def __init__(self, uploads: CheckpointUploads, rank: int, gather: Gather,
                 consolidate_max_bytes: int) -> None:
        self.uploads, self.rank, self.gather = uploads, rank, gather
        self.consolidate_max_bytes = consolidate_max_bytes

    def submit(self, step: int, files: list[Path], record: Record | None = None) -> None:
        """Store this rank's ``files`` of step ``step`` in the background; with ``record``
        (rank 0), the row once every rank's are stored. Raises the previous one's error."""
        self.uploads.background(f"accum-shards-{step}", lambda: self._store(step, files, record))

    def wait(self) -> None:
        self.uploads.wait()

    def _store(self, step: int, files: list[Path], record: Record | None) -> None:
        started = time.perf_counter()
        stored: dict[str, dict[str, Any]] = {}
        error: BaseException | None = None
        try:
            for path in files:
                stored[path.name] = self._put(step, path)
        except Exception as exc:  # told to every rank first: none waits for a row that never comes
            error = exc
        outcomes = self.gather({"files": stored, "error": None if error is None else f"rank {self.rank}: {error}"})
        if error is not None:
            raise error
        failed = [o["error"] for o in outcomes if o["error"]]
        if failed:
            raise ShardUploadFailed(f"checkpoint at step {step} not recorded: {'; '.join(failed)}")
        for path in files:  # this rank's staging folder, emptied into the cache
            shutil.rmtree(path.parent, ignore_errors=True)
        if record is not None:
            every = {name: facts for o in outcomes for name, facts in o["files"].items()}
            stored_row = self._manifest(step, every)
            self.uploads.delete(record(stored_row, time.perf_counter() - started))

    def _put(self, step: int, path: Path) -> dict[str, Any]:
        sha256, size = sha256_of(path)
        key = f"{manifest_key(self.uploads.job_id, step).rsplit('/', 1)[0]}/{path.name}"
        self.uploads.put(key, path, sha256, size)
        self.uploads.cache.adopt(key, path)
        return {"sha256": sha256, "size": size, "rank": self.rank}

    def _manifest(self, step: int, files: dict[str, dict[str, Any]]) -> ObjectInfo:
        """Rank 0: the consolidated file (if small enough) and the manifest stored; the row's
        object facts."""
        key = manifest_key(self.uploads.job_id, step)
        shard_bytes = sum(int(f["size"]) for f in files.values())
        consolidated = None
        if 0 < shard_bytes <= self.consolidate_max_bytes:
            consolidated = self._consolidate(key, files)
        manifest = {"format": MANIFEST_FORMAT, "step": step, "files": files, "consolidated": consolidated}
        staging = self.uploads.staging_dir
        staging.mkdir(parents=True, exist_ok=True)
        path = staging / f"{step}.{Path(key).name}"
        path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        sha256, size = sha256_of(path)
        self.uploads.put(key, path, sha256, size)
        self.uploads.cache.adopt(key, path)
        total = shard_bytes + size + (int(consolidated["size"]) if consolidated else 0)
        return ObjectInfo(key=key, size=total, sha256=consolidated["sha256"] if consolidated else sha256)

    def _consolidate(self, key: str, files: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Every rank's files into this node's cache (fetched where another node wrote them),
        then the full state in one file, stored beside them."""
        from accumcore import consolidate_checkpoint  # lazy: torch.distributed.checkpoint

        folder = fetch_checkpoint(self.uploads.store, self.uploads.cache, key, files=files)
        target = self.uploads.staging_dir / f"{Path(folder).name}.{CONSOLIDATED}"
        consolidate_checkpoint(folder, target)
        try:
            sha256, size = sha256_of(target)
            self.uploads.put(consolidated_key(key), target, sha256, size)
        finally:
            target.unlink(missing_ok=True)
        return {"sha256": sha256, "size": size}
