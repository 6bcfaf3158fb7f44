"""``strategy: "fsdp"`` on one GPU with ``fsdp.cpu_offload`` (the Gemini pattern: shards in
host memory): a world of 1 that shards, in a process group of one rank made around the
attempt in the worker's own process (``services.worker.single_group``). On this CPU machine the
job's one rank is the CPU, so the offload moves nothing; what is checked is the path a GPU
takes: the model is sharded (FSDP2 DTensors, CPUOffloadPolicy), trains like the plain job to
float32 round-off, its checkpoint is its rank's shards plus the consolidated file the plain
model loads, a cancelled job resumes
from it, and the worker process is left with no process group for its next job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_worker_fsdp import ROUND_OFF, SPEC, _run_then_cancel, final_weights, largest_difference

from services.artifacts import consolidated_key, manifest_key
from services.jobdb import checkpoints, events, jobs
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.spec import parse_spec
from services.worker.build import build_run
from services.worker.place import Place
from services.worker.runner import run_job
from services.worker.single_group import single_rank_group
from services.worker.strategy import model_wrapper

pytestmark = pytest.mark.timeout(600)

ONE: dict[str, Any] = {**SPEC, "gpus": 1}
OFFLOADED: dict[str, Any] = {**ONE, "strategy": "fsdp", "fsdp": {"cpu_offload": True}}


def test_one_offloaded_rank_is_sharded_with_cpu_offload_in_a_group_of_one() -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.tensor import DTensor

    spec = parse_spec(OFFLOADED)
    with single_rank_group("cpu"):
        assert dist.get_world_size() == 1
        run = build_run(spec, callbacks=[], checkpoint_dir=None, device="cpu",
                        wrap_model=model_wrapper(spec, Place(device="cpu")))
        assert run.trainer.sharded and not run.trainer.verify_window
        assert all(isinstance(p, DTensor) for p in run.trainer.model.parameters())
        groups = [module._get_fsdp_state()._fsdp_param_group  # noqa: SLF001
                  for module in run.trainer.model.modules() if hasattr(module, "_get_fsdp_state")]
        policies = [group.offload_policy for group in groups if group is not None]
        assert policies and all(isinstance(policy, CPUOffloadPolicy) for policy in policies)
        assert [kind for kind, _, _ in run.notes] == ["verify_window_skipped"]
    assert not dist.is_initialized()
    plain = build_run(parse_spec(ONE), callbacks=[], checkpoint_dir=None, device="cpu",
                      wrap_model=model_wrapper(parse_spec(ONE), Place(device="cpu")))
    assert not plain.trainer.sharded and plain.notes == []


def test_an_offloaded_job_trains_like_the_plain_job_and_leaves_no_group(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    offloaded, plain = make_job(OFFLOADED), make_job(ONE)
    assert run_job(settings, offloaded, "offload-worker") == "succeeded"
    assert not dist.is_initialized()  # torn down: the worker's next job starts clean
    assert run_job(settings, plain, "offload-worker") == "succeeded"
    with session_factory(settings)() as session:
        kept = [c.key for c in checkpoints.list_checkpoints(session, offloaded)]
        kinds = [e.kind for e in events.list_events(session, offloaded)]
    assert kept == [manifest_key(offloaded, 3), manifest_key(offloaded, 6)]  # its one rank's shards
    assert "verify_window_skipped" in kinds and "fsdp_unsharded" not in kinds
    difference = largest_difference(final_weights(settings, offloaded), final_weights(settings, plain))
    assert difference <= ROUND_OFF, difference
    first = torch.load(settings.artifacts_path / consolidated_key(kept[0]), weights_only=True)
    assert difference < largest_difference(first["model"], final_weights(settings, offloaded))


@pytest.mark.slow
def test_a_cancelled_offloaded_job_resumes_exactly(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    spec = {**OFFLOADED, "max_steps": 1500, "checkpoint_every": 10_000}  # long enough to cancel mid-run
    interrupted, straight = make_job(spec), make_job(spec)
    stopped_at = _run_then_cancel(settings, interrupted)
    assert 0 < stopped_at < 1500 and not dist.is_initialized()
    sessions = session_factory(settings)
    with sessions.begin() as session:
        jobs.request_resume(session, jobs.load_job(session, interrupted))
    assert run_job(settings, interrupted, "offload-worker") == "succeeded"
    assert run_job(settings, straight, "offload-worker") == "succeeded"
    difference = largest_difference(final_weights(settings, interrupted), final_weights(settings, straight))
    assert difference <= ROUND_OFF, difference
