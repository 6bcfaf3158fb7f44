"""``micro_batch_size: "auto"`` is chosen once: the first attempt stores (m, N) on the job row
(``micro_batch_chosen``, with an event telling the user) and later attempts train with it,
whatever a probe would pick on their hardware. Real jobs through ``run_job`` on a migrated
store; on the CPU the first choice is the whole per-rank batch, and a GPU's earlier choice is
the column as the first attempt on a GPU writes it."""

from __future__ import annotations

from collections.abc import Callable

from accumcore import load_checkpoint
from services.jobdb import events, jobs
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.spec import parse_spec
from services.worker.attempt import Attempt
from services.worker.micro_batch import CHOSEN, remember
from services.worker.runner import run_job

SPEC = {"model": "mlp", "dataset": "digits", "micro_batch_size": "auto", "effective_batch_size": 32,
        "max_steps": 2, "optimizer": {"name": "sgd", "lr": 0.1}, "checkpoint_every": 2}


def _chosen(settings: Settings, job_id: str) -> tuple[dict | None, list[dict]]:
    """The job's column, and its ``micro_batch_chosen`` events."""
    with session_factory(settings)() as session:
        job = jobs.load_job(session, job_id)
        assert job is not None
        return job.micro_batch_chosen, [e.data for e in events.list_events(session, job_id, limit=1000)
                                        if e.kind == CHOSEN]


def test_the_first_attempt_stores_its_choice_on_the_job(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job(SPEC)
    assert run_job(settings, job_id, "w") == "succeeded"
    choice = {"micro_batch_size": 32, "accumulation_steps": 1}
    assert _chosen(settings, job_id) == (choice, [choice])


def test_a_later_attempt_reuses_the_stored_choice(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job(SPEC)
    # What a first attempt on a GPU with less free memory chose: 8 x 4 (the CPU would pick 32 x 1).
    first = Attempt(job_id, 1, "gpu-worker/1", None, SPEC)
    remember(session_factory(settings), parse_spec(SPEC), first, 8, 4)
    assert run_job(settings, job_id, "w") == "succeeded"
    choice = {"micro_batch_size": 8, "accumulation_steps": 4}
    assert _chosen(settings, job_id) == (choice, [choice])  # not chosen again
    with session_factory(settings)() as session:
        job = jobs.load_job(session, job_id)
        assert job is not None and job.status == "succeeded"
    state = load_checkpoint(next((settings.artifacts_path / job_id).glob("*.pt")))
    assert state["accumulation"]["schedule"] == {0: 4}
    assert state["progress"]["step"] == 2


def test_a_fixed_micro_batch_stores_no_choice(settings: Settings, make_job: Callable[..., str]) -> None:
    fixed = {**SPEC, "micro_batch_size": 8}
    job_id = make_job(fixed)
    assert run_job(settings, job_id, "w") == "succeeded"
    assert _chosen(settings, job_id) == (None, [])


def _never_probed() -> int:
    raise AssertionError("the probe ran although the choice was already made")


def test_decide_keeps_a_fixed_micro_batch_and_an_earlier_choice_without_probing() -> None:
    from services.worker.micro_batch import decide

    fixed = parse_spec({**SPEC, "micro_batch_size": 8})
    assert decide(fixed, chosen=None, device="cuda:0", world=1, probe=_never_probed) == (8, 4)
    auto = parse_spec(SPEC)
    assert decide(auto, chosen=(4, 8), device="cuda:0", world=1, probe=_never_probed) == (4, 8)
    # On the CPU nothing runs out of memory: the whole per-rank batch in one micro-batch.
    assert decide(auto, chosen=None, device="cpu", world=1, probe=_never_probed) == (32, 1)


def test_decide_on_a_gpu_takes_the_probed_micro_batch_and_derives_n() -> None:
    from services.worker.micro_batch import decide

    # The probe's m is what fits on the device (find_micro_batch_size); N makes m x N the batch.
    assert decide(parse_spec(SPEC), chosen=None, device="cuda:0", world=1, probe=lambda: 16) == (16, 2)
    halves = parse_spec({**SPEC, "gpus": 2, "effective_batch_size": 64})
    assert decide(halves, chosen=(8, 4), device="cuda:1", world=2, probe=_never_probed) == (8, 4)
