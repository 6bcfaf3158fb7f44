"""``compile: true`` through the worker: the job's model is compiled (forward and backward), the
job says how long compiling took as a ``compiled`` event after its first step, and trains to
the same weights as the eager job within float32 round-off (compiled kernels may reorder
sums). A worker whose toolchain is missing says so as a ``compile_fallback`` event at the
start and trains eagerly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from job_specs import TINY_SPEC

from accumcore import fast_path
from services.jobdb import checkpoints, events
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.spec import parse_spec
from services.worker.build import build_run
from services.worker.runner import run_job

pytestmark = pytest.mark.timeout(900)

SPEC: dict[str, Any] = {**TINY_SPEC, "max_steps": 6, "checkpoint_every": 6, "gpus": 0}


def kinds_and_data(settings: Settings, job_id: str) -> dict[str, dict[str, Any]]:
    with session_factory(settings)() as session:
        return {e.kind: e.data or {} for e in events.list_events(session, job_id)}


def final_model(settings: Settings, job_id: str) -> dict[str, torch.Tensor]:
    with session_factory(settings)() as session:
        last = checkpoints.list_checkpoints(session, job_id)[-1]
    return torch.load(settings.artifacts_path / last.key, map_location="cpu", weights_only=True)["model"]


@pytest.mark.skipif(fast_path.compile_available() is not None, reason="no inductor toolchain")
def test_a_compiled_job_reports_its_compile_time_and_trains_like_the_eager_job(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    torch._dynamo.reset()
    compiled, eager = make_job({**SPEC, "compile": True}), make_job(SPEC)
    assert run_job(settings, compiled, "compile-worker") == "succeeded"
    assert run_job(settings, eager, "compile-worker") == "succeeded"
    said = kinds_and_data(settings, compiled)
    assert "compiled" in said and said["compiled"]["compile_s"] > 0, said
    assert "compiled" not in kinds_and_data(settings, eager)
    a, b = final_model(settings, compiled), final_model(settings, eager)
    assert a.keys() == b.keys()  # the compiled module's checkpoint loads into the plain model
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5


def test_a_worker_without_a_toolchain_trains_eagerly_and_says_so() -> None:
    from torch._inductor import config as inductor_config

    with inductor_config.patch({"cpp.cxx": ("/bin/false",)}):
        run = build_run(parse_spec({**SPEC, "compile": True}), callbacks=[], checkpoint_dir=None, device="cpu")
    [(kind, message, data)] = [note for note in run.notes if note[0].startswith("compile")]
    assert kind == "compile_fallback" and "C++ compiler" in data["reason"] and "eagerly" in message
