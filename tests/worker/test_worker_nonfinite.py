"""A diverged job does not end ``succeeded``: ``on_nonfinite`` in the spec picks the policy.

With a learning rate of 1e30 the first step blows the weights up and the loss is inf/NaN from
step 2 on. The spec refuses such a rate (``lr`` is at most 10), so the test sets it on the
built optimizer, as a diverging model of the user's own would behave.
``"fail"`` (the default) fails the job with accumcore's NonFiniteError message (the step, the
metric, the last checkpoint with finite values); ``"skip"`` skips those steps with a
``nonfinite_step_skipped`` event each, and the job ends once they are too many in a row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from job_specs import TINY_SPEC

from services.api.schemas import JobPublic
from services.jobdb import events, jobs
from services.jobdb.nonfinite import LABELS
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker import rank
from services.worker.runner import run_job

DIVERGING: dict[str, Any] = {**TINY_SPEC, "max_steps": 6, "checkpoint_every": 1}
BLOW_UP_LR = 1e30


@pytest.fixture(autouse=True)
def diverging_learning_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run as the worker builds it, its learning rate then raised to 1e30 (the scheduler's
    base rate too, or its first step would restore the spec's)."""
    build = rank.build_run

    def build_then_raise_lr(*args: Any, **kwargs: Any) -> Any:
        run = build(*args, **kwargs)
        for group in run.trainer.optimizer.param_groups:
            group["lr"] = group["initial_lr"] = BLOW_UP_LR
        if run.trainer.scheduler is not None:
            run.trainer.scheduler.base_lrs = [BLOW_UP_LR] * len(run.trainer.optimizer.param_groups)
        return run

    monkeypatch.setattr(rank, "build_run", build_then_raise_lr)


def _job_and_kinds(settings: Settings, job_id: str) -> tuple[Any, list[str]]:
    with session_factory(settings)() as session:
        return jobs.load_job(session, job_id), [e.kind for e in events.list_events(session, job_id)]


def test_a_diverging_job_fails_with_the_step_metric_and_last_finite_checkpoint(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job(DIVERGING)
    assert run_job(settings, job_id, "w") == "failed"
    job, kinds = _job_and_kinds(settings, job_id)
    assert job.status == "failed" and job.error["type"] == "NonFiniteError"
    message = job.error["message"]
    assert message.startswith("step 2: ") and " is " in message
    assert f"{settings.artifacts_url}/{job_id}/1.pt (step 1)" in message  # the store, not a node
    assert kinds[-2:] == ["traceback", "failed"]
    # Where it stopped and on what, for the views: the job reads NaN there, not the last
    # finite loss before it.
    stop = job.error["nonfinite"]
    assert stop["step"] == 2 and stop["metric"] in ("loss", "grad_norm") and stop["value"] in LABELS
    with session_factory(settings)() as session:
        public = JobPublic.model_validate(jobs.load_job(session, job_id))
    assert public.latest_metrics[stop["metric"]] is None
    assert public.nonfinite_metrics[stop["metric"]] == stop["value"]


def test_skip_policy_records_each_skipped_step(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job({**DIVERGING, "on_nonfinite": "skip"})
    assert run_job(settings, job_id, "w") == "succeeded"
    job, kinds = _job_and_kinds(settings, job_id)
    assert kinds.count("nonfinite_step_skipped") == 5  # steps 2..6: the weights are inf after step 1
    assert job.progress["optimizer_step"] == 6
