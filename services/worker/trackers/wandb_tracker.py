"""Weights & Biases through its official client (``wandb``), online or offline.

The run's id is the job's id, so every attempt continues it (``resume="allow"``). Offline
(air-gapped nodes) each attempt leaves a run directory under ACCUM_WANDB_DIR that
``wandb sync <dir>`` uploads later, in order, to that same run; the last step the earlier
directories hold is read back from their run files, so a resumed attempt logs each step once.
Credentials: WANDB_API_KEY in the worker's environment. Telemetry, code, git and requirements
capture are off: the worker sends the job's metrics and nothing else (the requirements scan
also cost ~60 ms of CPU an attempt). The points go as history records (``wandb_history``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from services.worker.trackers.base import FinalCheckpoint, RunIdentity, StepPoints
from services.worker.trackers.wandb_files import last_step
from services.worker.trackers.wandb_history import HistoryPublisher

EXIT_CODE = {"succeeded": 0, "failed": 1, "cancelled": 2}


def run_files(root: Path, job_id: str) -> list[Path]:
    """The offline run files of a job under ``root``, oldest first."""
    return sorted(root.glob(f"wandb/offline-run-*-{job_id}/run-{job_id}.wandb"))


class WandbTracker:
    name = "wandb"

    def __init__(self, mode: str, project: str, entity: str, root: Path, base_url: str) -> None:
        self.mode: Literal["online", "offline"] = "offline" if mode == "offline" else "online"
        self.project, self.entity = project, entity or None
        self.root, self.base_url = root, base_url.rstrip("/")
        self.run: Any = None
        self.history: HistoryPublisher | None = None

    def open(self, identity: RunIdentity) -> tuple[str, str | None, int | None]:
        import wandb  # the trackers extra

        held = last_step(run_files(self.root, identity.job_id)) if self.mode == "offline" else -1
        self.root.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(x_disable_stats=True, x_disable_meta=True, console="off",
                                  save_code=False, disable_git=True, silent=True,
                                  x_save_requirements=False, init_timeout=60)
        self.run = wandb.init(
            id=identity.job_id, resume="allow", mode=self.mode, dir=str(self.root),
            project=self.project, entity=self.entity, name=identity.name,
            tags=[f"owner:{identity.owner}", f"queue:{identity.queue}"],
            config={**identity.params, **identity.tags}, settings=settings, reinit="create_new",
        )
        self.history = HistoryPublisher(self.run)
        if self.mode == "online":  # the server's account of the resumed run
            held = int(self.run.starting_step) - 1
        entity = self.entity or getattr(self.run, "entity", None) or ""
        url = (f"{self.base_url}/{entity}/{self.project}/runs/{identity.job_id}"
               if self.mode == "online" and entity else None)
        return identity.job_id, url, held

    def send(self, points: list[StepPoints], tags: dict[str, str]) -> None:
        """The points as W&B history records in one hand-off (``wandb_history``: ``run.log``
        per step cost ~110 us a step), the tags in the run's summary."""
        assert self.history is not None
        self.history.publish(points)
        if tags:
            self.run.summary.update(tags)

    def finish(self, status: str, checkpoint: FinalCheckpoint | None) -> None:
        if checkpoint is not None:
            self.run.summary["accum.checkpoint"] = checkpoint.url
        self.run.summary["accum.status"] = status
        self.run.finish(exit_code=EXIT_CODE.get(status, 0))
        self.run = self.history = None

    def close(self) -> None:
        if self.run is not None:  # the job goes on in a later attempt: release, don't finish
            self.run.finish(exit_code=0)
            self.run = self.history = None
