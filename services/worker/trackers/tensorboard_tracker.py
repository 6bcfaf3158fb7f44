"""TensorBoard event files through torch's ``SummaryWriter`` (tensorboard's event writer).

A job's files live under ``<artifacts>/tensorboard/<job id>/``, one file per attempt, so
``tensorboard --logdir <artifacts>/tensorboard`` shows every job. On a local store the writer
writes there directly; on s3:// it writes in this node's staging directory and each batch
uploads the file through the artifact store (a few kB per batch). A resumed attempt opens its
writer with ``purge_step`` = the first step it sends: TensorBoard then drops what a killed
attempt wrote past the last delivered step, so each step shows once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.artifacts import ArtifactStore
from services.worker.trackers.base import FinalCheckpoint, RunIdentity, StepPoints

PREFIX = "tensorboard"


def logdir_key(job_id: str) -> str:
    """The job's folder in the artifact store."""
    return f"{PREFIX}/{job_id}"


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, store: ArtifactStore, local_root: Path, base_url: str) -> None:
        self.store, self.local_root, self.base_url = store, local_root, base_url.rstrip("/")
        self.writer: Any = None  # torch's SummaryWriter, imported with the extra
        self.key = ""

    def open(self, identity: RunIdentity) -> tuple[str, str | None, int | None]:
        from torch.utils.tensorboard import SummaryWriter  # the trackers extra

        self.key = logdir_key(identity.job_id)
        directory = self.local_root / self.key
        purge = identity.delivered_step + 1 if identity.delivered_step >= 0 else None
        # flush_secs: the sink flushes after each batch itself.
        writer = SummaryWriter(str(directory), purge_step=purge, flush_secs=3600)
        writer.add_text("accum/spec", "```\n" + json.dumps(identity.params, indent=1) + "\n```", 0)
        writer.add_text("accum/run", json.dumps({"name": identity.name, **identity.tags}), 0)
        self.writer = writer
        url = f"{self.base_url}/?runFilter={identity.job_id}" if self.base_url else None
        return identity.job_id, url, None  # purge_step makes the row's step the truth

    def send(self, points: list[StepPoints], tags: dict[str, str]) -> None:
        writer = self.writer
        assert writer is not None
        for p in points:
            for key, value in p.values.items():
                writer.add_scalar(key, value, p.step)
        for tag, text in tags.items():
            writer.add_text(tag, text, points[-1].step if points else 0)
        writer.flush()
        self._upload()

    def _upload(self) -> None:
        if self.store.url.startswith("file:"):
            return  # written in place
        for path in (self.local_root / self.key).iterdir():
            self.store.put(f"{self.key}/{path.name}", path)

    def finish(self, status: str, checkpoint: FinalCheckpoint | None) -> None:
        writer = self.writer
        assert writer is not None
        if checkpoint is not None:
            writer.add_text("accum/checkpoint", checkpoint.url, checkpoint.step)
        writer.add_text("accum/status", status, checkpoint.step if checkpoint else 0)
        writer.flush()
        self._upload()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self._upload()
            self.writer = None
