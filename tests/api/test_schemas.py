"""services.api.schemas: response models read from store rows (`from_attributes`), with
what a row may hold empty or free-form normalised to the documented shape."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from services.api.schemas import CheckpointPublic, EventPublic, JobPublic
from services.jobdb.models import Checkpoint, Job, JobEvent

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def job_row(**columns: Any) -> Job:
    """A job row as the store holds it, not yet taken by a worker, changed by `columns`."""
    defaults: dict[str, Any] = {
        "id": "0" * 26, "owner_id": 1, "name": "mlp-digits", "status": "queued", "spec": {},
        "effective_batch_size": 64, "progress": None, "attempts": 0, "error": None,
        "created_at": NOW, "started_at": None, "finished_at": None, "latest_metrics": None,
        "queue": "default", "worker_host": None, "worker_gpu": None,
    }
    return Job(**{**defaults, **columns})


def test_a_fresh_row_reads_with_zero_progress_empty_metrics_and_no_worker() -> None:
    job = JobPublic.model_validate(job_row())

    assert job.progress.model_dump() == {"epoch": 0, "optimizer_step": 0, "total_optimizer_steps": None}
    assert job.latest_metrics == {} and job.error is None and job.worker is None
    assert job.owner is None  # not a column: the routes add it


def test_null_counts_read_as_zero_and_unknown_progress_keys_are_dropped() -> None:
    progress = {"epoch": None, "optimizer_step": 7, "total_optimizer_steps": 9, "extra": 1}

    job = JobPublic.model_validate(job_row(progress=progress))

    assert job.progress.model_dump() == {"epoch": 0, "optimizer_step": 7, "total_optimizer_steps": 9}


def test_the_worker_and_the_error_take_their_documented_shape() -> None:
    row = job_row(status="failed", worker_host="node-1", error={"message": 5, "traceback": "..."})

    job = JobPublic.model_validate(row)
    job.owner = "alice"

    assert job.worker is not None and job.worker.model_dump() == {"name": None, "host": "node-1", "gpu": None}
    assert job.error is not None
    assert job.error.model_dump() == {"type": "Error", "message": "5", "reason": None,
                                      "nonfinite": None}
    assert job.model_dump()["owner"] == "alice"


def test_events_and_checkpoints_answer_null_json_as_empty_objects() -> None:
    event = JobEvent(id=1, kind="created", message="m", data=None, attempt=0, created_at=NOW)
    checkpoint = Checkpoint(
        step=4, epoch=None, size_bytes=10, sha256="ab", created_at=NOW, metrics=None, is_best=True
    )

    assert EventPublic.model_validate(event).data == {}
    assert CheckpointPublic.model_validate(checkpoint).metrics == {}


def test_the_strategy_and_each_ranks_peak_memory_are_read_from_the_spec_and_metrics() -> None:
    peaks = {"peak_memory_bytes": 300.0, "peak_memory_bytes_rank0": 300.0, "peak_memory_bytes_rank1": 280.0}
    sharded = JobPublic.model_validate(job_row(spec={"gpus": 2, "strategy": "fsdp"}, latest_metrics=peaks))
    replicated = JobPublic.model_validate(job_row(spec={"gpus": 2}))
    offloaded = JobPublic.model_validate(job_row(spec={"gpus": 1, "strategy": "fsdp"}))
    alone = JobPublic.model_validate(job_row(spec={"gpus": 1}, latest_metrics={"peak_memory_bytes": 9.0}))

    assert (sharded.strategy, sharded.peak_memory_bytes_per_rank) == ("fsdp", [300.0, 280.0])
    assert (replicated.strategy, replicated.peak_memory_bytes_per_rank) == ("ddp", None)
    assert offloaded.strategy == "fsdp"  # one GPU with CPU offload is sharded too
    assert (alone.strategy, alone.peak_memory_bytes_per_rank) == (None, [9.0])  # one process: rank 0
    cpu = JobPublic.model_validate(job_row(spec={"gpus": 0}, latest_metrics={"loss": 1.0}))
    assert cpu.peak_memory_bytes_per_rank is None  # no allocator peak off CUDA


def test_the_world_is_read_from_the_spec_with_its_defaults() -> None:
    one = JobPublic.model_validate(job_row(spec={"gpus": 1}))  # nodes and min_nodes left out, as stored
    gang = JobPublic.model_validate(job_row(spec={"gpus": 2, "nodes": 2, "min_nodes": 1}))
    cpu_gang = JobPublic.model_validate(job_row(spec={"gpus": 0, "nodes": 3}))

    assert one.world is not None and one.world.model_dump() == {"gpus": 1, "nodes": 1, "min_nodes": 1, "ranks": 1}
    assert gang.world is not None and gang.world.model_dump() == {"gpus": 2, "nodes": 2, "min_nodes": 1, "ranks": 4}
    assert cpu_gang.world is not None and (cpu_gang.world.min_nodes, cpu_gang.world.ranks) == (3, 3)
    assert (one.strategy, gang.strategy, cpu_gang.strategy) == (None, "ddp", "ddp")  # one process per CPU node
