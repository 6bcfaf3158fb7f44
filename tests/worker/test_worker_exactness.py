"""Every job checks its first window against the big batch (spec ``verify_window``, default on).

Through the real runner (``run_job``: spec -> accumcore -> store): a catalog job passes and
records an ``exactness_check`` event and the ``exactness_rel_error`` metric at step 0; a loss
that sums (a user's loss: the catalog's losses are right, so the test swaps the one the
worker builds) fails the job before its first step with the cause in the job's error;
``"warn"`` records the failure and trains; ``false`` skips the check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from job_specs import TINY_SPEC
from torch.nn import functional as F

from services.api.schemas import exactness
from services.jobdb import events, jobs
from services.jobdb.metrics import read_metrics
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker import build
from services.worker.runner import run_job


class SumLoss(torch.nn.Module):
    reduction = "mean"  # says so, but sums

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets, reduction="sum")


@pytest.fixture
def summing_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "build_loss", lambda bundle, model=None: SumLoss())


def _job(settings: Settings, job_id: str) -> tuple[Any, list[Any], Any]:
    with session_factory(settings)() as session:
        job = jobs.load_job(session, job_id)
        found = events.list_events(session, job_id)
        latest = events.latest_event(session, job_id, "exactness_check")
        session.expunge_all()
        return job, found, latest


def test_a_catalog_job_passes_and_records_event_and_metric(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    job_id = make_job(TINY_SPEC)
    assert run_job(settings, job_id, "w") == "succeeded"
    job, found, latest = _job(settings, job_id)
    checks = [e for e in found if e.kind == "exactness_check"]
    assert len(checks) == 1 and checks[0].id == latest.id
    data = latest.data
    assert data["passed"] is True and 0 <= data["rel_error"] <= data["tolerance"] == 1e-6
    # mlp on digits, m = 16, N = 2: the first window's 32 samples, each an item.
    assert data["items"] == 32 and data["item_counts"] == [16, 16]
    assert latest.message.startswith("first window = big batch: relative error")
    # Before the first optimizer step: the event comes before the first checkpoint.
    kinds = [e.kind for e in found]
    assert kinds.index("exactness_check") < kinds.index("checkpoint")
    with session_factory(settings)() as session:
        points, _ = read_metrics(session, job_id, "exactness_rel_error")
    assert [(p.step, p.value) for p in points] == [(0, data["rel_error"])]
    shown = exactness(job.spec, latest)
    assert shown.checked and shown.passed and shown.rel_error == data["rel_error"] and shown.tolerance == 1e-6


CATALOG_CASES = {
    # BatchNorm (the check runs in eval mode), fp16 autocast in training, 8-sample windows.
    "resnet18-fake-fp16": {"model": "resnet18", "dataset": {"name": "fake", "size": 32, "val_size": 8,
                                                              "image_size": 32},
                           "precision": "fp16", "micro_batch_size": 4},
    # Padded token targets: n_i differ between micro-batches.
    "tiny_transformer-text-bf16": {"model": "tiny_transformer", "dataset": "text", "precision": "bf16",
                                   "micro_batch_size": 4},
    "small_cnn-digits-fp32": {"model": "small_cnn", "dataset": "digits", "micro_batch_size": 8},
}


@pytest.mark.parametrize("case", sorted(CATALOG_CASES))
def test_catalog_models_pass_in_every_precision(
    settings: Settings, make_job: Callable[..., str], case: str
) -> None:
    job_id = make_job({**TINY_SPEC, "max_steps": 1, **CATALOG_CASES[case]})
    assert run_job(settings, job_id, "w") == "succeeded"
    _, _, latest = _job(settings, job_id)
    assert latest.data["passed"] is True, latest.message
    assert latest.data["rel_error"] <= 1e-6 and latest.data["precision"] == "fp32"
    assert latest.data["micro_batches"] == 2 and len(latest.data["item_counts"]) == 2


def test_a_failed_check_fails_the_job_with_the_cause(
    settings: Settings, make_job: Callable[..., str], summing_loss: None
) -> None:
    job_id = make_job(TINY_SPEC)
    assert run_job(settings, job_id, "w") == "failed"
    job, found, latest = _job(settings, job_id)
    assert job.error["type"] == "ExactnessError"
    assert "reduction='mean'" in job.error["message"] and "verify_window='warn'" in job.error["message"]
    assert not (job.progress or {}).get("optimizer_step")
    assert latest.data["passed"] is False and latest.data["cause"] == "reduction"
    assert [e.kind for e in found][-2:] == ["traceback", "failed"]
    shown = exactness(job.spec, latest)
    assert shown.checked and shown.passed is False and "cause reduction" in shown.note


def test_warn_records_the_failure_and_trains(
    settings: Settings, make_job: Callable[..., str], summing_loss: None
) -> None:
    job_id = make_job({**TINY_SPEC, "verify_window": "warn"})
    assert run_job(settings, job_id, "w") == "succeeded"
    job, _, latest = _job(settings, job_id)
    assert job.progress["optimizer_step"] == 3
    assert latest.data["passed"] is False and latest.data["rel_error"] > 1e-6


def test_verify_window_false_skips_the_check(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job({**TINY_SPEC, "verify_window": False})
    assert run_job(settings, job_id, "w") == "succeeded"
    job, found, latest = _job(settings, job_id)
    assert latest is None and "exactness_check" not in [e.kind for e in found]
    shown = exactness(job.spec, None)
    assert not shown.checked and shown.note == "verify_window is false: not checked"
