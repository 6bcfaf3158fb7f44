"""TensorBoard event files, written a batch of steps at a time (``tensorboard_events``).

A job's files live under ``<artifacts>/tensorboard/<job id>/``, one file per attempt (a long
attempt's continued in a new file every 8 MiB), so ``tensorboard --logdir
<artifacts>/tensorboard`` shows every job. On a local store the files are written there
directly; on s3:// they are written in this node's staging directory and each batch uploads
the file being written through the artifact store. A resumed attempt starts its file with a
purge marker at the first step it sends (as torch's ``SummaryWriter(purge_step=...)`` does):
TensorBoard then drops what a killed attempt wrote past the last delivered step, so each step
shows once.
"""

from __future__ import annotations

import json
from pathlib import Path

from services.artifacts import ArtifactStore
from services.worker.trackers.base import FinalCheckpoint, RunIdentity, StepPoints
from services.worker.trackers.tensorboard_events import EventFiles

PREFIX = "tensorboard"


def logdir_key(job_id: str) -> str:
    """The job's folder in the artifact store."""
    return f"{PREFIX}/{job_id}"


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, store: ArtifactStore, local_root: Path, base_url: str) -> None:
        self.store, self.local_root, self.base_url = store, local_root, base_url.rstrip("/")
        self.files: EventFiles | None = None
        self.key = ""

    def open(self, identity: RunIdentity) -> tuple[str, str | None, int | None]:
        self.key = logdir_key(identity.job_id)
        purge = identity.delivered_step + 1 if identity.delivered_step >= 0 else None
        files = EventFiles(self.local_root / self.key, purge)
        files.text("accum/spec", "```\n" + json.dumps(identity.params, indent=1) + "\n```", 0)
        files.text("accum/run", json.dumps({"name": identity.name, **identity.tags}), 0)
        self.files = files
        url = f"{self.base_url}/?runFilter={identity.job_id}" if self.base_url else None
        return identity.job_id, url, None  # purge_step makes the row's step the truth

    def send(self, points: list[StepPoints], tags: dict[str, str]) -> None:
        files = self.files
        assert files is not None
        files.scalars(points)
        for tag, text in tags.items():
            files.text(tag, text, points[-1].step if points else 0)
        self._flush(files)

    def _flush(self, files: EventFiles) -> None:
        files.flush()
        if self.store.url.startswith("file:"):
            return  # written in place
        for path in files.take_changed():
            self.store.put(f"{self.key}/{path.name}", path)

    def finish(self, status: str, checkpoint: FinalCheckpoint | None) -> None:
        files = self.files
        assert files is not None
        if checkpoint is not None:
            files.text("accum/checkpoint", checkpoint.url, checkpoint.step)
        files.text("accum/status", status, checkpoint.step if checkpoint else 0)
        self._flush(files)

    def close(self) -> None:
        if self.files is not None:
            self._flush(self.files)
            self.files.close()
            self.files = None
