"""System metrics per step (services/worker/system_metrics.py): on a CPU worker, or without
NVML, a job logs none (no made-up zeros); the job's metrics are the trainer's alone."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from services.jobdb import jobs, metrics
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker.runner import run_job
from services.worker.system_metrics import NAMES, gpu_sampler


def test_a_cpu_job_logs_no_gpu_metric(settings: Settings, make_job: Callable[..., str]) -> None:
    job_id = make_job()
    assert run_job(settings, job_id, "w") == "succeeded"
    with session_factory(settings)() as session:
        names = set(metrics.metric_names(session, job_id))
        latest = jobs.load_job(session, job_id).latest_metrics  # type: ignore[union-attr]
    assert {"loss", "lr", "step_time_s"} <= names
    assert not names & set(NAMES) and not set(latest) & set(NAMES)


def test_no_sampler_on_cpu_or_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu_sampler("cpu") is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed: import fails
    assert gpu_sampler("cuda:0") is None
