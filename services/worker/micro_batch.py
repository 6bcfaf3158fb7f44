"""``micro_batch_size`` of an attempt, decided here and only here: m and N from the spec, or,
for ``"auto"``, chosen once per job and stored on the job row.

    micro, steps = decide(spec, chosen=attempt.micro_batch, probe=...)   # build.build_run
    remember(sessions, attempt, micro, steps)                            # rank 0, first attempt

``"auto"`` probes the largest m that fits on the GPU (``probe``; on the CPU nothing runs out of
memory, so the whole per-rank batch is one micro-batch). A resumed attempt on another GPU, or
beside another process, could pick another m, and the checkpoint would be refused ("resume
with the same accumulation_steps"): the job would fail for good. So the first attempt stores
its (m, N) in the job's ``micro_batch_chosen`` column (shown by ``GET /v1/jobs/{id}``), the
claim reads it into ``Attempt.micro_batch``, and every later attempt trains with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from accumcore.auto_batch import accumulation_for, find_micro_batch_size
from accumcore.data import make_loader
from services.jobdb.events import add_event
from services.jobdb.models import Job
from services.spec import JobSpec, accumulation_at, effective_batch_size, world_size
from services.worker.attempt import Attempt

CHOSEN = "micro_batch_chosen"  # the column, and the kind of the event that tells the user

Choice = tuple[int, int | dict[int, int]]


def from_spec(spec: JobSpec) -> Choice:
    """(m, N) from the spec. ``"auto"``: the whole per-rank batch in one micro-batch, which a
    probe on a GPU refines."""
    if spec.micro_batch_size == "auto":
        return per_rank_batch(spec), 1
    steps = spec.accumulation_steps
    if isinstance(steps, dict):
        return spec.micro_batch_size, {int(e): int(n) for e, n in steps.items()}
    n = accumulation_at(spec, 0)
    assert n is not None
    return spec.micro_batch_size, n


def per_rank_batch(spec: JobSpec) -> int:
    return effective_batch_size(spec) // world_size(spec)


def decide(spec: JobSpec, *, chosen: tuple[int, int] | None, device: str, world: int,
           probe: Callable[[], int]) -> Choice:
    """The attempt's (m, N): the spec's; for ``"auto"`` the job's earlier choice (``chosen``),
    else ``probe()``'s m on a GPU (the smallest over the ranks, so it fits on every one), else
    the whole per-rank batch."""
    if spec.micro_batch_size != "auto":
        return from_spec(spec)
    if chosen is not None:
        return chosen
    if not device.startswith("cuda"):
        return from_spec(spec)
    micro = probe()
    if world > 1:  # every rank must run the same (m, N)
        micro = smallest_over_ranks(micro, device)
    return micro, accumulation_for(per_rank_batch(spec), micro)


def probe_on_device(spec: JobSpec, model: torch.nn.Module, train: Any, collate_fn: Any, loss_fn: Any,
                    device: str, optimizer: torch.optim.Optimizer | None = None) -> int:
    """The largest m dividing the per-rank effective batch that fits on the GPU (m x N == B)."""

    def sample(m: int) -> Any:
        return next(iter(make_loader(train, m, shuffle=False, collate_fn=collate_fn)))

    # The job's own optimizer type sizes the optimizer state in the probe; read-ahead is
    # assumed (the conservative side) because the loader depends on the m being chosen.
    return find_micro_batch_size(model, sample, per_rank_batch(spec), device, loss_fn=loss_fn,
                                 precision=spec.precision, optimizer=optimizer)


def smallest_over_ranks(micro: int, device: str) -> int:
    """The smallest m the ranks picked (one all-reduce): a divisor of the per-rank batch that
    fits on every rank."""
    import torch.distributed as dist  # lazy: only DDP ranks get here (services.worker.launch says why)

    picked = torch.tensor([micro], device=device)
    dist.all_reduce(picked, op=dist.ReduceOp.MIN)
    return int(picked.item())


def chosen_of(job: Job) -> tuple[int, int] | None:
    """The (m, N) stored on the job row, or None."""
    stored = job.micro_batch_chosen
    if not stored:
        return None
    return int(stored["micro_batch_size"]), int(stored["accumulation_steps"])


def remember(sessions: sessionmaker[Session], spec: JobSpec, attempt: Attempt, micro: int,
             steps: int | dict[int, int]) -> None:
    """Store the (m, N) this attempt chose for ``"auto"`` on the job row, once (an earlier
    choice is kept), with an event telling the user."""
    if spec.micro_batch_size != "auto" or attempt.micro_batch is not None:
        return
    assert isinstance(steps, int)  # "auto" takes no accumulation schedule
    choice = {"micro_batch_size": int(micro), "accumulation_steps": int(steps)}
    with sessions.begin() as session:
        stored = session.execute(
            update(Job).where(Job.id == attempt.job_id, Job.micro_batch_chosen.is_(None))
            .values(micro_batch_chosen=choice)
        ).rowcount  # type: ignore[attr-defined]
        if stored:
            add_event(
                session, attempt.job_id, CHOSEN,
                f'micro_batch_size "auto" chose {micro} x {steps} micro-batches per step; later '
                "attempts reuse it, so a resume on other hardware keeps the same accumulation",
                choice, attempt=attempt.attempt,
            )
