"""Accumulation schedules: a fixed N, or an epoch schedule ``{0: 8, 4: 2}`` as in Lightning."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class AccumulationSchedule:
    """Number of micro-batches per window (N) for each epoch.

    ``{0: 8, 4: 2}`` means N=8 for epochs 0-3 and N=2 from epoch 4 on. Epochs before the
    first key use N=1, as in Lightning's GradientAccumulationScheduler.
    """

    def __init__(self, spec: int | Mapping[int, int]) -> None:
        if isinstance(spec, bool) or not isinstance(spec, int | Mapping):
            raise TypeError(
                "accumulation_steps must be an int >= 1 or a dict {epoch: N}, "
                f"got {type(spec).__name__}"
            )
        raw = {0: spec} if isinstance(spec, int) else dict(spec)
        if not raw:
            raise ValueError("accumulation_steps schedule is empty; pass e.g. {0: 4}")
        for epoch, steps in raw.items():
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError(
                    f"accumulation_steps schedule keys are epochs (ints >= 0), got {epoch!r}"
                )
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
                raise ValueError(
                    f"accumulation_steps[{epoch}] must be an int >= 1, got {steps!r}"
                )
        self.schedule: dict[int, int] = dict(sorted(raw.items()))

    def at(self, epoch: int) -> int:
        steps = 1
        for start, value in self.schedule.items():
            if start > epoch:
                break
            steps = value
        return steps

    @property
    def max_steps(self) -> int:
        return max(self.schedule.values())

    def state_dict(self) -> dict[str, Any]:
        return {"schedule": dict(self.schedule)}
