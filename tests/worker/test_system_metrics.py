"""System metrics per step (services/worker/system_metrics.py): a job's metrics hold the host's
CPU and memory use and the training process's RSS (psutil), recorded at its steps and sent to
its trackers like the others; GPU figures are left out on a CPU worker or without NVML (no
made-up zeros), and the job's `system_metrics` event says so."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import pytest
from job_specs import TINY_SPEC

from services.jobdb import jobs, metrics
from services.jobdb.events import list_events
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker.runner import run_job
from services.worker.system_metrics import HOST_NAMES, NAMES, SystemMetrics, gpu_sampler

WAIT_S = 10.0


def test_a_cpu_jobs_metrics_hold_host_cpu_memory_and_rss_and_its_trackers_get_them(
    settings: Settings, make_job: Callable[..., str],
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracked = settings.model_copy(update={"trackers": ["tensorboard"]})
    job_id = make_job({**TINY_SPEC, "trackers": ["tensorboard"]})
    assert run_job(tracked, job_id, "w") == "succeeded"
    with session_factory(settings)() as session:
        names = set(metrics.metric_names(session, job_id))
        latest = jobs.load_job(session, job_id).latest_metrics  # type: ignore[union-attr]
        [event] = [e for e in list_events(session, job_id) if e.kind == "system_metrics"]
    assert {"loss", "lr", "step_time_s", *HOST_NAMES} <= names
    assert 0 <= latest["host_cpu_percent"] <= 100 and latest["process_rss_bytes"] > 10 * 2**20
    assert not names & set(NAMES) and not set(latest) & set(NAMES)  # no GPU figure on a CPU job
    assert event.message.startswith("system metrics every 1 s: host_cpu_percent, host_memory_percent, "
                                    "process_rss_bytes; not recorded: GPU utilisation and memory: "
                                    "the job trains on cpu, not a GPU")
    tensorboard = EventAccumulator(str(settings.artifacts_path / "tensorboard" / job_id))
    tensorboard.Reload()
    assert set(HOST_NAMES) <= set(tensorboard.Tags()["scalars"])


def test_each_sample_joins_one_step_and_the_thread_takes_the_next() -> None:
    system = SystemMetrics(every_s=0.05)
    system.start("cpu")
    try:
        first, second = {"step": 1.0}, {"step": 2.0}
        system.on_step(None, first)
        system.on_step(None, second)
        assert set(first) == {"step", *HOST_NAMES} and second == {"step": 2.0}  # each sample once
        deadline = time.monotonic() + WAIT_S
        later = {"step": 3.0}
        while set(later) == {"step"} and time.monotonic() < deadline:
            time.sleep(0.01)
            system.on_step(None, later)
        assert set(later) == {"step", *HOST_NAMES}
    finally:
        system.close()


def test_no_gpu_sampler_on_cpu_or_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu_sampler("cpu") is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed: import fails
    assert gpu_sampler("cuda:0") is None
    system = SystemMetrics()
    note = system.start("cuda:0")
    system.close()
    assert "not recorded: GPU utilisation and memory: NVML is not available on this worker" in note
