"""What every tracker client offers the sink, and what a job's run in it is made of.

A tracker (``mlflow_tracker``, ``tensorboard_tracker``, ``wandb_tracker``) wraps one official
client. The sink (``sink.TrackerSink``) calls it from its own thread only, so a client never
sees two calls at once, and a call that raises (server down) is simply made again later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class RunIdentity:
    """One tracker run per job: named after the job, tagged with its id, owner and queue;
    the spec's fields (flattened, ``optimizer.lr``) are its parameters."""

    job_id: str
    name: str
    owner: str
    queue: str
    params: dict[str, str]
    # What the run had before this attempt: its id in the tracker, and the last step it has.
    run_id: str | None = None
    delivered_step: int = -1
    # The checkpoint step this attempt starts from (0: the start): the steps up to it are
    # earlier attempts' (read back from the store), later ones this attempt's own.
    resume_step: int = 0

    @property
    def tags(self) -> dict[str, str]:
        return {"accum.job_id": self.job_id, "accum.owner": self.owner, "accum.queue": self.queue}


@dataclass
class StepPoints:
    """Every metric of one optimizer step (its training metrics and, when there was one, the
    evaluation at that step)."""

    step: int
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class FinalCheckpoint:
    """Where the job's final checkpoint is: the store's URL, and this node's copy if it has one."""

    step: int
    url: str
    local_path: str | None


class Tracker(Protocol):
    name: str

    def open(self, identity: RunIdentity) -> tuple[str, str | None, int | None]:
        """Start or continue the job's run; returns its id, its web address (None when the
        tracker has none) and the last step the run holds by the tracker's own account (-1:
        none; None: it cannot tell, and ``identity.delivered_step`` is taken)."""
        ...

    def send(self, points: list[StepPoints], tags: dict[str, str]) -> None:
        """Deliver points (steps ascending) and tags; raises when the tracker is unreachable."""
        ...

    def finish(self, status: str, checkpoint: FinalCheckpoint | None) -> None:
        """The job's end (status: succeeded, failed, cancelled): the checkpoint's location,
        the run's end state."""
        ...

    def close(self) -> None:
        """Release the client (files, processes); the run may be continued by a later attempt."""
        ...


def flat_params(spec: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"optimizer": {"lr": 0.1}}`` -> ``{"optimizer.lr": "0.1"}``: the spec as parameters."""
    params: dict[str, str] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            params.update(flat_params(value, name + "."))
        else:
            params[name] = str(value)
    return params
