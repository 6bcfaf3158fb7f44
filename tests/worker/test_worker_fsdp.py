"""``strategy: "fsdp"`` jobs on a worker with 2 CPU ranks (gloo): the model sharded with
``accumcore.shard`` before its optimizer is built; every rank stores its own checkpoint shards
in the artifact store under ``<job>/<step>/``, the row (its key the manifest's, its size every
object's) written once all are stored, with a consolidated file beside them when they are
small enough (what the download gives: ``torch.load`` into the plain model); a cancelled job
resumed on another node's cache from the shards alone continues where it stopped; ``init_from``
loads the shards.

The data order of a ``gpus: 2`` job is its ranks' shards (``build.rank_shard``), so the FSDP
job is compared with the same job under DDP (the same samples per window), to float32 round-off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from services.artifacts import consolidated_key, manifest_key, sha256_of
from services.artifacts.cache import NodeCache
from services.catalog.build import build_model
from services.jobdb import checkpoints, events, jobs
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.spec import parse_spec
from services.worker.build import build_data
from services.worker.checkpoints.fetch import fetch_checkpoint, read_manifest
from services.worker.checkpoints.stores import artifact_store
from services.worker.runner import run_job
from services.worker.warm_start import load_initial_weights

pytestmark = pytest.mark.timeout(600)

SPEC: dict[str, Any] = {
    "model": "mlp", "dataset": "digits", "micro_batch_size": 32, "accumulation_steps": 2,
    "max_steps": 6, "optimizer": {"name": "adamw", "lr": 0.01, "weight_decay": 0.01},
    "grad_clip_norm": 1.0, "gpus": 2, "checkpoint_every": 3, "keep_checkpoints": 5,
}
FSDP = {**SPEC, "strategy": "fsdp", "fsdp": {"sync": "window"}}
ROUND_OFF = 1e-5  # float32: the two strategies reduce the gradients in other orders


def plain_model() -> torch.nn.Module:
    spec = parse_spec(SPEC)
    return build_model(spec.model.name, build_data(spec, None), **spec.model.options)


def run_to_success(settings: Settings, job_id: str, worker: str = "fsdp-worker") -> None:
    """Run the job's attempt on ``worker``; it must succeed (else: its error and events)."""
    outcome = run_job(settings, job_id, worker)
    if outcome != "succeeded":
        with session_factory(settings)() as session:
            job = jobs.load_job(session, job_id)
            said = [(e.kind, e.message) for e in events.list_events(session, job_id, limit=1000)]
        pytest.fail(f"job {job_id} {outcome}: {job.error if job else None}; events {said}")


def final_weights(settings: Settings, job_id: str) -> dict[str, torch.Tensor]:
    """The job's last stored checkpoint, read the way a user reads the downloaded file: into
    the plain (unsharded) model with ``torch.load`` + ``load_state_dict``; a sharded job's from
    its consolidated file, or loaded from its shards (``accumcore.load_checkpoint``)."""
    with session_factory(settings)() as session:
        last = checkpoints.list_checkpoints(session, job_id)[-1]
        key, sha256 = last.key, last.sha256
    model = plain_model()
    if key.endswith(".pt"):
        state = torch.load(settings.artifacts_path / key, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])  # strict: every key of the plain model, full shapes
    else:
        from accumcore import load_checkpoint

        cache = NodeCache(settings.cache_path / "reader", 1 << 30)
        load_checkpoint(fetch_checkpoint(artifact_store(settings), cache, key, sha256), model=model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
def test_an_fsdp_job_trains_like_the_ddp_job_every_rank_storing_its_shards(
    settings: Settings, make_job: Callable[..., str]
) -> None:
    sharded, replicated = make_job(FSDP), make_job(SPEC)
    run_to_success(settings, sharded)
    run_to_success(settings, replicated)
    with session_factory(settings)() as session:
        kept = [(c.step, c.key, c.size_bytes, c.sha256) for c in checkpoints.list_checkpoints(session, sharded)]
        kinds = [e.kind for e in events.list_events(session, sharded)]
    assert [(step, key) for step, key, _, _ in kept] == [(3, manifest_key(sharded, 3)), (6, manifest_key(sharded, 6))]
    for step, key, size, sha256 in kept:
        folder = settings.artifacts_path / sharded / str(step)
        names = sorted(p.name for p in folder.iterdir())
        # Each rank's DCP file (rank 0's also .metadata and trainer.pt), the manifest, the full file.
        assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "consolidated.pt", "manifest.json",
                         "trainer.pt"], names
        assert size == sum(p.stat().st_size for p in folder.iterdir())  # quota counts every object
        manifest = read_manifest(artifact_store(settings), NodeCache(settings.cache_path, 1 << 30), key)
        assert {f["rank"] for f in manifest["files"].values()} == {0, 1}
        assert manifest["consolidated"]["sha256"] == sha256  # the row's: what a download serves
    assert "verify_window_skipped" in kinds  # the spec's default verify_window: true, said so
    # The consolidated file is the plain model's full state dict, torch.load-able.
    full = torch.load(settings.artifacts_path / consolidated_key(kept[-1][1]), weights_only=True)
    model = plain_model()
    model.load_state_dict(full["model"])
    difference = largest_difference(dict(model.state_dict()), final_weights(settings, replicated))
    assert difference <= ROUND_OFF, difference
    assert largest_difference(dict(model.state_dict()), final_weights(settings, sharded)) == 0.0
    first = torch.load(settings.artifacts_path / consolidated_key(kept[0][1]), weights_only=True)
    assert difference < largest_difference(first["model"], final_weights(settings, sharded))  # it trained


@pytest.mark.slow
def test_init_from_a_sharded_checkpoint_loads_its_shards_into_the_plain_model(
    settings: Settings, make_job: Callable[..., str], tmp_path: Path
) -> None:
    shards_only = settings.model_copy(update={"consolidate_max_bytes": 0})
    sharded = make_job(FSDP)
    run_to_success(shards_only, sharded)
    with session_factory(settings)() as session:
        last = checkpoints.list_checkpoints(session, sharded)[-1]
        key, sha256 = last.key, last.sha256
    assert not (settings.artifacts_path / consolidated_key(key)).exists()  # shards only
    assert sha256 == sha256_of(settings.artifacts_path / key)[0]  # the row's: the manifest's
    # Another node's cache: every rank's files fetched from the store, loaded by init_from's reader.
    folder = fetch_checkpoint(artifact_store(settings), NodeCache(tmp_path / "node-2", 1 << 30), key, sha256)
    warm = plain_model()
    report = load_initial_weights(warm, folder, strict=True)
    assert report["loaded"] == len(warm.state_dict()) and not report["missing_keys"]
    assert largest_difference(dict(warm.state_dict()), final_weights(settings, sharded)) == 0.0
    assert largest_difference(dict(warm.state_dict()), dict(plain_model().state_dict())) > 0  # not the init


def _run_then_cancel(settings: Settings, job_id: str) -> int:
    """Run the job's attempt, cancel it once rank 0 recorded a step; the step it stopped at."""
    outcome: list[str | None] = []
    runner = threading.Thread(target=lambda: outcome.append(run_job(settings, job_id, "fsdp-worker")))
    runner.start()
    sessions = session_factory(settings)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        with sessions() as session:
            job = jobs.load_job(session, job_id)
            assert job is not None and job.status in ("queued", "running"), job.error if job else None
            if job.status == "running" and job.progress.get("optimizer_step", 0) > 0:
                break
        time.sleep(0.05)
    with sessions.begin() as session:
        jobs.request_cancel(session, jobs.load_job(session, job_id))
    runner.join(timeout=180)
    assert outcome == ["cancelled"], outcome
    with sessions() as session:
        return int(jobs.load_job(session, job_id).progress["optimizer_step"])  # type: ignore[union-attr]


STEPS = 240


@pytest.mark.slow
def test_a_cancelled_fsdp_job_resumes_from_the_store_on_another_node_exactly(
    settings: Settings, make_job: Callable[..., str], tmp_path: Path
) -> None:
    # Long enough that the cancel (noticed at the next heartbeat, 1 s) lands before the end on a
    # quiet machine too: at 80 steps a fresh-clone run finished first, 1 run in 4.
    spec = {**FSDP, "max_steps": STEPS, "checkpoint_every": 1000}
    interrupted, straight = make_job(spec), make_job(spec)
    stopped_at = _run_then_cancel(settings, interrupted)
    assert 0 < stopped_at < STEPS
    sessions = session_factory(settings)
    with sessions.begin() as session:
        jobs.request_resume(session, jobs.load_job(session, interrupted))
    # Another node: its own cache and staging directory; only the artifact store is shared. Its
    # checkpoints are shards only: the resume loads every rank's files, not a consolidated one.
    other = settings.model_copy(update={"cache_dir": tmp_path / "other-node-cache", "consolidate_max_bytes": 0})
    run_to_success(other, interrupted, "fsdp-worker-2")
    run_to_success(settings, straight)
    with sessions() as session:
        job = jobs.load_job(session, interrupted)
        assert job is not None and job.attempts == 2 and job.progress["optimizer_step"] == STEPS
    difference = largest_difference(final_weights(settings, interrupted), final_weights(settings, straight))
    assert difference <= ROUND_OFF, difference


def test_a_nonfinite_error_names_a_sharded_checkpoint_as_its_stored_folder(tmp_path: Path) -> None:
    from accumcore import NonFiniteError
    from services.worker.rank import in_store

    staged = tmp_path / "staging" / "12"  # the trainer's sharded checkpoint directory
    error = NonFiniteError(f"loss is nan; the last checkpoint with finite values is {staged} (step 12)",
                           step=13, metric="loss", value=float("nan"), checkpoint=staged)
    assert "s3://bucket/job/12/ (step 12)" in str(in_store(error, "s3://bucket/job/"))
