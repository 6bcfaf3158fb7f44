"""``micro_batch_size: "auto"`` is chosen once per job, at its first attempt, and reused.

The probe (``build.probe_micro_batch``) picks m from the memory free on the device it runs
on; a resumed attempt on another GPU, or beside another process, could pick another m, and
the checkpoint would be refused ("resume with the same accumulation_steps"): the job would
fail for good. So the first attempt records its (m, N) as a ``micro_batch_chosen`` event
(the job's log is its record: no column needed) and every later attempt trains with it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from services.store.events import add_event, latest_event

CHOSEN = "micro_batch_chosen"


def recorded_choice(sessions: sessionmaker[Session], job_id: str) -> tuple[int, int] | None:
    """(m, N) chosen by an earlier attempt of the job, or None."""
    with sessions() as session:
        event = latest_event(session, job_id, CHOSEN)
        if event is None:
            return None
        return int(event.data["micro_batch_size"]), int(event.data["accumulation_steps"])


def record_choice(sessions: sessionmaker[Session], job_id: str, attempt: int, micro: int, steps: Any) -> None:
    """Record the (m, N) this first attempt chose, for every later attempt."""
    with sessions.begin() as session:
        add_event(
            session, job_id, CHOSEN,
            f'micro_batch_size "auto" chose {micro} x {steps} micro-batches per step; later '
            "attempts reuse it, so a resume on other hardware keeps the same accumulation",
            {"micro_batch_size": int(micro), "accumulation_steps": int(steps)}, attempt=attempt,
        )
