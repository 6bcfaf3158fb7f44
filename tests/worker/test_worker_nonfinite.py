"""A diverged job does not end ``succeeded``: ``on_nonfinite`` in the spec picks the policy.

With ``lr: 1e30`` the first step blows the weights up and the loss is inf/NaN from step 2 on.
``"fail"`` (the default) fails the job with accumcore's NonFiniteError message (the step, the
metric, the last checkpoint with finite values); ``"skip"`` skips those steps with a
``nonfinite_step_skipped`` event each, and the job ends once they are too many in a row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from job_specs import TINY_SPEC

from services.settings import Settings
from services.store import events, jobs
from services.worker.db import session_factory
from services.worker.runner import run_job

DIVERGING: dict[str, Any] = {**TINY_SPEC, "max_steps": 6, "checkpoint_every": 1,
                             "optimizer": {"name": "sgd", "lr": 1e30}}


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


def test_skip_policy_records_each_skipped_step(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job({**DIVERGING, "on_nonfinite": "skip"})
    assert run_job(settings, job_id, "w") == "succeeded"
    job, kinds = _job_and_kinds(settings, job_id)
    assert kinds.count("nonfinite_step_skipped") == 5  # steps 2..6: the weights are inf after step 1
    assert job.progress["optimizer_step"] == 6
