"""Recorded clients for the tracker tests: small fakes that take the calls accum's tracker code
makes and keep them, so a test asserts what was sent without a tracker server.

``RecordedTracker`` is a ``Tracker`` (services/worker/trackers/base.py) for ``TrackerSink``: it
keeps each ``open``/``send``/``finish``/``close``, the steps and tags it got, and can be down
(every call raises ``ConnectionError``, as a client does when its server is unreachable) until
``up()``. ``RecordedRun`` is the part of a W&B run that ``wandb_history.HistoryPublisher``
hands its records to (the run's interface, its summary), keeping each hand-off.

The real clients against real trackers are checked once each, end to end
(tests/worker/test_trackers.py); these carry the rest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from services.worker.trackers.base import FinalCheckpoint, RunIdentity, StepPoints

T = TypeVar("T")
# Only a guard against a hang: every wait below returns as soon as its condition holds.
HANG_S = 240.0


def until(check: Callable[[], T], what: str, detail: Callable[[], object] = lambda: "",
          timeout: float = HANG_S) -> T:
    """``check()``'s first true result, polled; fails (with ``detail()``) only past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s\n{detail()}")
        time.sleep(0.02)
    return result


@dataclass
class RecordedTracker:
    """A tracker whose client records every call (see the module's docstring)."""

    name: str = "mlflow"
    held: int | None = -1  # the last step the run holds by the tracker's own account
    run_id: str = "run-1"
    url: str | None = "http://tracker.test/runs/run-1"
    down: bool = False
    calls: list[str] = field(default_factory=list)  # the calls it took, in order
    refused: int = 0  # the calls it refused while down
    identity: RunIdentity | None = None
    sent: list[StepPoints] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    ended: tuple[str, FinalCheckpoint | None] | None = None

    def up(self) -> None:
        self.down = False

    def _take(self, call: str) -> None:
        if self.down:
            self.refused += 1
            raise ConnectionError(f"{self.name} is down ({call})")
        self.calls.append(call)

    def open(self, identity: RunIdentity) -> tuple[str, str | None, int | None]:
        self._take("open")
        self.identity = identity
        return self.run_id, self.url, self.held

    def send(self, points: list[StepPoints], tags: dict[str, str]) -> None:
        self._take("send")
        self.sent.extend(StepPoints(p.step, dict(p.values)) for p in points)
        self.tags.update(tags)

    def finish(self, status: str, checkpoint: FinalCheckpoint | None) -> None:
        self._take("finish")
        self.ended = (status, checkpoint)

    def close(self) -> None:
        self._take("close")

    def points(self) -> dict[str, list[tuple[int, float]]]:
        """What it got: metric -> (step, value), in the order sent."""
        out: dict[str, list[tuple[int, float]]] = {}
        for p in self.sent:
            for name, value in p.values.items():
                out.setdefault(name, []).append((p.step, value))
        return out


class RecordedRun:
    """A W&B run as ``HistoryPublisher`` uses it, recording each hand-off: ``batches`` (one list
    of history records per call on W&B's asyncio thread, the socket interface's way) or
    ``records`` (one call each, an older client's ``_publish_history``), and ``summary``'s
    updates."""

    def __init__(self, batched: bool, start_time: float = 1_000.0) -> None:
        self.start_time = start_time
        self.batches: list[list[Any]] = []
        self.records: list[Any] = []
        self.summary = RecordedSummary()
        self._interface = RecordedSocketInterface(self) if batched else RecordedInterface(self)

    def history(self) -> list[Any]:
        """Every history record handed over, in order, whichever way."""
        return [*(r for batch in self.batches for r in batch), *self.records]


class RecordedInterface:
    """An older client's interface: one history record a call."""

    def __init__(self, run: RecordedRun) -> None:
        self.run = run

    def _publish_history(self, history: Any) -> None:
        self.run.records.append(history)


class RecordedSocketInterface:
    """The socket interface's parts the publisher uses: a stream id, a client whose ``publish``
    takes a server request, and the asyncio thread's ``run``."""

    _stream_id = "stream-1"

    def __init__(self, run: RecordedRun) -> None:
        self.recording = run
        self._client = self
        self._asyncer = self
        self._batch: list[Any] = []

    async def publish(self, request: Any) -> None:
        assert request.record_publish._info.stream_id == self._stream_id
        self._batch.append(request.record_publish.history)

    def run(self, make: Callable[[], Any]) -> Any:
        """``AsyncioManager.run``: the coroutine ``make()`` to its end; its publishes are one batch."""
        self._batch = []
        result = asyncio.run(make())
        self.recording.batches.append(self._batch)
        return result


class RecordedSummary(dict[str, Any]):
    """The run's summary: its updates kept in order, the last value of each key in the dict."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[dict[str, Any]] = []

    def update(self, values: Any = (), /, **more: Any) -> None:  # type: ignore[override]
        values = {**dict(values), **more}
        self.updates.append(values)
        super().update(values)
