"""Holding a job at a known step, for the tests that kill or freeze its process mid-job: the
job stays short, and the fault still lands while it trains (a long job only made that likely).

The job trains ``held_digits`` (tests/held_plugin/held_digits.py: the shipped digits, the same
tensors read the same way) with ``hold_after`` set to the micro-batches of ``step`` optimizer
steps. While the gate file exists, each training process waits at its next micro-batch load
after those, and says so with a ``<gate>.held.<pid>`` file: the test waits for that (and for
the progress it needs), kills or stops a process, and releases the gate; what is left of the
job then trains on the survivors. No product switch: only the test's workers carry the
plugin (``Hold.env``) and only its processes see the gate.

    hold = Hold(tmp_path / "gate")
    own.start_worker(**hold.env())
    with plugin_on_path():                   # a reference run of the same spec, never held
        reference_id = own.create(**spec, dataset=Hold.dataset(step=12, micro_batches=2))
    job_id = hold.create(own, **spec, dataset=Hold.dataset(step=12, micro_batches=2))
    hold.wait_held(own, job_id, processes=2, step=12, checkpoint=10)  # held after step 12
    ...kill or SIGSTOP...; hold.release()

A gate, its markers and the workers are one test's own (its tmp_path): safe under xdist.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker_stack import Stack

from services.jobdb import checkpoints
from services.jobdb.models import Job

PLUGIN_PATH = Path(__file__).resolve().parent / "held_plugin"
GATE_VARIABLE = "HELD_DIGITS_GATE"  # held_digits.GATE_VARIABLE (that module is not on this path)
HELD_TIMEOUT_S = 180.0  # two workers starting (importing torch) on a loaded machine, then the steps


@contextlib.contextmanager
def plugin_on_path() -> Iterator[None]:
    """``held_digits`` visible to this process (spec checks read the installed entry points)
    for the block only: no other test of this process lists it among the plugins."""
    sys.path.insert(0, str(PLUGIN_PATH))
    try:
        yield
    finally:
        sys.path.remove(str(PLUGIN_PATH))


@dataclass
class Hold:
    """One test's gate: a file of its own (its tmp_path), safe beside other tests under xdist."""

    gate: Path

    def env(self) -> dict[str, str]:
        """For a worker that may train a held job: the plugin on its path, the gate named."""
        path = os.pathsep.join(p for p in (str(PLUGIN_PATH), os.environ.get("PYTHONPATH", "")) if p)
        return {"PYTHONPATH": path, GATE_VARIABLE: str(self.gate)}

    @staticmethod
    def dataset(step: int, micro_batches: int) -> dict[str, Any]:
        """The spec's ``dataset``: held at the first load after optimizer step ``step`` of a
        process that loads ``micro_batches`` micro-batches a step (N of its rank)."""
        return {"name": "held_digits", "hold_after": step * micro_batches}

    def create(self, own: Stack, **spec: Any) -> str:
        """``own.create(**spec)`` with the gate closed first: the job holds when it gets there."""
        self.gate.touch()
        with plugin_on_path():
            return own.create(**spec)

    def held(self) -> list[int]:
        """The pids of the processes that reached the hold."""
        return [int(p.name.rsplit(".", 1)[1]) for p in self.gate.parent.glob(f"{self.gate.name}.held.*")]

    def wait_held(self, own: Stack, job_id: str, processes: int, step: int, checkpoint: int | None = None) -> Job:
        """The job once ``processes`` of its training processes wait at the gate, its progress
        (flushed each second while it waits) has reached ``step``, and, if given, the checkpoint
        of step ``checkpoint`` is listed (a resume then loads one); polls, with a deadline."""
        deadline = time.monotonic() + HELD_TIMEOUT_S
        while True:
            job = own.job(job_id)
            reached = (job.progress or {}).get("optimizer_step", 0)
            with own.sessions() as session:
                kept = [c.step for c in checkpoints.list_checkpoints(session, job_id)]
            held = self.held()
            if (job.status == "running" and len(held) >= processes and reached >= step
                    and (checkpoint is None or checkpoint in kept)):
                return job
            where = (f"job {job.status} at step {reached}, checkpoints {kept}, {len(held)} of {processes} "
                     f"processes held (waiting for step {step}, checkpoint {checkpoint})")
            assert job.status in ("queued", "running"), (where, job.error, own.worker_logs())
            assert time.monotonic() < deadline, (f"after {HELD_TIMEOUT_S:g} s: {where}", own.worker_logs())
            time.sleep(0.05)

    def release(self) -> None:
        """Open the gate: held processes (and any later build) train on."""
        self.gate.unlink(missing_ok=True)
