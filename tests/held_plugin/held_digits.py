"""A dataset plugin for tests only: the shipped 8x8 digits, whose training reads a test can hold
at a known point, so that it kills (SIGKILL) or freezes (SIGSTOP) a job's process while the job
is surely mid-job, without making the job long.

Not installed: a real distribution on a path (this folder, with ``held_digits-0.1.dist-info``
beside the module: entry point ``held_digits`` of the groups ``accum.datasets`` and
``accum.dataset_options``). A test puts the folder on its workers' PYTHONPATH and, while it
submits, on its own ``sys.path`` (the spec is checked there); tests/held_jobs.py does both.

Option ``hold_after`` (micro-batches): with ``HELD_DIGITS_GATE=<file>`` in the environment of
the process that trains, its load of a training micro-batch after ``hold_after`` others waits
while ``<file>`` exists, having first written ``<file>.held.<pid>`` to say so. Micro-batches are
counted per build (so per attempt and per rank) and by their indices: a batch read again (the
trainer's check of the first window, an FSDP rank's 0-row offer) is not another, so a process
loading N micro-batches a step holds after exactly ``hold_after / N`` steps. Without the variable, or once the
file is gone, this is the plain ``digits``: the same tensors, read the same way (a
``TensorDataset``, its inputs loaded just in time), so the same trajectory as an unheld run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

GATE_VARIABLE = "HELD_DIGITS_GATE"
# What the API and the worker accept (plugin option declarations are typed, never free).
OPTIONS = {"hold_after": {"type": "integer", "minimum": 0, "maximum": 1_000_000}}
POLL_S = 0.01
# A hold the test never released (it failed before its cleanup): end the rank's read rather
# than wait for ever.
MAX_HOLD_S = 600.0


class HeldTensors(TensorDataset):
    """``TensorDataset`` whose micro-batch loads (``__getitems__``, the batched fetch the
    trainer and the DataLoader use) wait at the gate after ``hold_after`` micro-batches."""

    def __init__(self, *tensors: torch.Tensor, hold_after: int, gate: Path | None) -> None:
        super().__init__(*tensors)
        self.hold_after = hold_after
        self.gate = gate
        self.loaded: set[tuple[int, ...]] = set()  # the micro-batches loaded, by their indices

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, ...]]:
        batch = tuple(indices)
        if batch not in self.loaded:
            if self.gate is not None and len(self.loaded) >= self.hold_after and self.gate.exists():
                self.hold(self.gate)
            self.loaded.add(batch)
        return [self[i] for i in indices]

    def hold(self, gate: Path) -> None:
        gate.with_name(f"{gate.name}.held.{os.getpid()}").write_text(str(len(self.loaded)))
        deadline = time.monotonic() + MAX_HOLD_S
        while gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"held at {gate} for {MAX_HOLD_S:g} s: the test never released it")
            time.sleep(POLL_S)


def held_digits(data_root: Path | None = None, seed: int = 0, hold_after: int = 0) -> dict[str, Any]:
    from services.catalog.build import build_dataset

    digits = build_dataset("digits", seed=seed)
    train = digits.train
    assert isinstance(train, TensorDataset), type(train)
    gate = os.environ.get(GATE_VARIABLE)
    info = digits.info
    return {"train": HeldTensors(*train.tensors, hold_after=hold_after, gate=Path(gate) if gate else None),
            "val": digits.val, "num_classes": info.num_classes, "task": info.task,
            "channels": info.channels, "image_size": info.image_size}
