"""``micro_batch_size: "auto"`` is chosen once: the first attempt records (m, N) as a
``micro_batch_chosen`` event and later attempts train with it, whatever a probe would pick on
their hardware. Real jobs through ``run_job`` on a migrated SQLite store; on the CPU the
first choice is the whole per-rank batch, and a GPU's earlier choice is an event written as
the first attempt on a GPU writes it."""

from __future__ import annotations

from collections.abc import Callable

from accumcore import load_checkpoint
from services.settings import Settings
from services.store import events, jobs
from services.store.sessions import session_factory
from services.worker.micro_batch import CHOSEN, record_choice
from services.worker.runner import run_job

SPEC = {"model": "mlp", "dataset": "digits", "micro_batch_size": "auto", "effective_batch_size": 32,
        "max_steps": 2, "optimizer": {"name": "sgd", "lr": 0.1}, "checkpoint_every": 2}


def _chosen_events(settings: Settings, job_id: str) -> list[dict]:
    with session_factory(settings)() as session:
        return [e.data for e in events.list_events(session, job_id, limit=1000) if e.kind == CHOSEN]


def test_the_first_attempt_records_its_choice(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job(SPEC)
    assert run_job(settings, job_id, "w") == "succeeded"
    assert _chosen_events(settings, job_id) == [{"micro_batch_size": 32, "accumulation_steps": 1}]


def test_a_later_attempt_reuses_the_recorded_choice(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job(SPEC)
    # What a first attempt on a GPU with less free memory chose: 8 x 4 (the CPU would pick 32 x 1).
    record_choice(session_factory(settings), job_id, 1, 8, 4)
    assert run_job(settings, job_id, "w") == "succeeded"
    assert _chosen_events(settings, job_id) == [{"micro_batch_size": 8, "accumulation_steps": 4}]  # not again
    with session_factory(settings)() as session:
        job = jobs.load_job(session, job_id)
        assert job is not None and job.status == "succeeded"
    state = load_checkpoint(next((settings.artifacts_path / job_id).glob("*.pt")))
    assert state["accumulation"]["schedule"] == {0: 4}
    assert state["progress"]["step"] == 2
