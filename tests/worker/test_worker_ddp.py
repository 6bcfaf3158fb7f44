"""gpus: 2 on CPU runs two gloo DDP ranks; rank 0 alone writes every step's metrics and the
checkpoints; the effective batch is m x N x 2, so an epoch takes half the optimizer steps."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.jobdb import checkpoints, jobs, metrics
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.spec import parse_spec, total_optimizer_steps
from services.worker.runner import run_job

SPEC = {"model": "mlp", "dataset": "digits", "micro_batch_size": 64, "accumulation_steps": 2,
        "epochs": 1, "optimizer": {"name": "sgd", "lr": 0.1}, "gpus": 2, "checkpoint_every": 10,
        "keep_checkpoints": 1}


@pytest.mark.slow
def test_two_gloo_ranks_train_one_epoch_with_rank0_writing(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    single = total_optimizer_steps(parse_spec({**SPEC, "gpus": 1}))
    expected = total_optimizer_steps(parse_spec(SPEC))
    assert expected == -(-single // 2)  # half the steps: each step sees 2 x 32 x 2 samples
    job_id = make_job(SPEC)
    assert run_job(settings, job_id, "ddp-worker") == "succeeded"
    with session_factory(settings)() as session:
        job = jobs.load_job(session, job_id)
        rows, _ = metrics.read_metrics(session, job_id, name="loss")
        kept = checkpoints.list_checkpoints(session, job_id)
    assert job is not None and job.status == "succeeded"
    assert job.progress["optimizer_step"] == expected
    assert [r.step for r in rows] == list(range(1, expected + 1))
    assert [c.step for c in kept] == [expected]
    files = list((settings.artifacts_path / job_id).glob("*.pt"))
    assert [f.name for f in files] == [f"{expected}.pt"]


def _run_then_cancel(settings: Settings, job_id: str, past_step: int) -> tuple[str | None, int]:
    """Run the job's next attempt on two ranks, cancel it once rank 0 recorded a step past
    ``past_step``; the attempt's outcome and the step it stopped at."""
    import threading
    import time

    outcome: list[str | None] = []
    runner = threading.Thread(target=lambda: outcome.append(run_job(settings, job_id, "ddp-worker")))
    runner.start()
    sessions = session_factory(settings)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with sessions() as session:
            job = jobs.load_job(session, job_id)
            assert job is not None
            if job.status == "running" and job.progress.get("optimizer_step", 0) > past_step:
                break
            assert job.status in ("queued", "running"), job.error  # it must not end first
        time.sleep(0.05)
    with sessions.begin() as session:
        assert jobs.request_cancel(session, jobs.load_job(session, job_id)).status == "cancelling"
    runner.join(timeout=120)
    with sessions() as session:
        job = jobs.load_job(session, job_id)
        assert job is not None
        return (outcome[0] if outcome else None), int(job.progress["optimizer_step"])


@pytest.mark.slow
def test_cancel_stops_every_rank_at_one_window_and_resume_continues_from_there(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    import multiprocessing

    from accumcore import load_checkpoint

    job_id = make_job({**SPEC, "epochs": None, "max_steps": 100_000, "checkpoint_every": 100_000})
    outcome, stopped_at = _run_then_cancel(settings, job_id, past_step=0)
    assert outcome == "cancelled" and stopped_at > 0
    assert multiprocessing.active_children() == []  # both ranks are gone
    sessions = session_factory(settings)
    with sessions() as session:
        assert jobs.load_job(session, job_id).status == "cancelled"  # type: ignore[union-attr]
        kept = [c.step for c in checkpoints.list_checkpoints(session, job_id)]
        rows, _ = metrics.read_metrics(session, job_id, name="loss", limit=1_000_000)
    assert kept == [stopped_at]  # where both ranks stopped, not the start
    assert [r.step for r in rows] == list(range(1, stopped_at + 1))  # the metrics stay
    files = list((settings.artifacts_path / job_id).glob("*.pt"))
    assert [f.name for f in files] == [f"{stopped_at}.pt"]
    state = load_checkpoint(files[0])
    assert len(state["rng"]["ranks"]) == 2  # every rank's RNG states: the resume is exact

    with sessions.begin() as session:
        jobs.request_resume(session, jobs.load_job(session, job_id))
    outcome, again = _run_then_cancel(settings, job_id, past_step=stopped_at)
    assert outcome == "cancelled" and again > stopped_at
    with sessions() as session:
        rows, _ = metrics.read_metrics(session, job_id, name="loss", limit=1_000_000)
        kept = [c.step for c in checkpoints.list_checkpoints(session, job_id)]
    assert [r.step for r in rows] == list(range(1, again + 1))  # continued, each step once
    assert kept[-1] == again and len(kept) <= 2  # keep_checkpoints 1, plus the best by val_loss
