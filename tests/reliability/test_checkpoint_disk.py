"""A checkpoint that cannot be written (the artefact disk is full, or read-only): the job
fails with an error that names the file, the cause and the fix; the previous checkpoint stays
intact and listed, with no temp or orphan file; once the disk is fixed, resuming the job
reaches the weights of an uninterrupted run. Real worker processes, SQLite and PostgreSQL +
Redis, with ACCUM_ARTIFACTS_DIR on a small tmpfs that fills up or is remounted read-only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from worker_stack import Stack, weight_differences

from services.jobdb import checkpoints
from services.jobdb.status import resume_hint

from .mounts import fill, remount, tmpfs

SPEC = {"max_steps": 1000, "checkpoint_every": 10, "keep_checkpoints": 2}
TMPFS_BYTES = 4 << 20  # room for a few jobs of 95 KB checkpoints, each in the store and the cache


@pytest.fixture(scope="module")
def disk_stack(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A worker whose artifact store (a local directory) and node cache, where the trainer
    writes each checkpoint first, are on a tmpfs; heartbeats every 0.25 s, so a cancel lands
    within a few dozen steps."""
    tmp = tmp_path_factory.mktemp(f"disk-{stack.name}")
    with tmpfs(tmp / "artifacts", TMPFS_BYTES) as mount:
        own = stack.variant(tmp, artifacts_dir=mount, cache_dir=mount / "cache",
                            heartbeat_interval_s=0.25)
        own.start_worker()
        try:
            yield own
        finally:
            own.stop_workers()


@pytest.fixture(scope="module")
def reference(stack: Stack) -> tuple[str, int]:
    """An uninterrupted run of SPEC on an ordinary disk: its id and its checkpoint size."""
    job_id = stack.create(**SPEC)
    assert stack.wait(job_id, timeout=120).status == "succeeded"
    with stack.sessions() as session:
        return job_id, checkpoints.list_checkpoints(session, job_id)[-1].size_bytes


@pytest.fixture(scope="module")
def reference_weights(stack: Stack, reference: tuple[str, int]) -> dict[str, Any]:
    """Its final weights, from its own store (the session stack's, not the tmpfs)."""
    return stack.final_weights(reference[0])


def listed_steps(stack: Stack, job_id: str) -> list[int]:
    with stack.sessions() as session:
        return [c.step for c in checkpoints.list_checkpoints(session, job_id)]


def resume_after_fix(own: Stack, job_id: str, reference_id: str,
                     reference_weights: dict[str, Any]) -> list[str]:
    """Resume the job; what differs from the uninterrupted run (weights, metric steps,
    checkpoint files)."""
    own.resume(job_id)
    job = own.wait(job_id, timeout=120)
    assert job.status == "succeeded", (job.error, own.worker_logs())
    differences = [f"weights of {n}" for n in weight_differences(
        own.final_weights(job_id), reference_weights)]
    if own.metric_steps_by_name(job_id) != own.metric_steps_by_name(reference_id):
        differences.append("metric steps")
    return differences + own.checkpoint_problems(job_id)


@pytest.mark.slow
def test_disk_full_at_checkpoint_keeps_the_previous_one(
    disk_stack: Stack, reference: tuple[str, int], reference_weights: dict[str, Any],
    record_figure: Any,
) -> None:
    reference_id, checkpoint_bytes = reference
    # The node cache and the store share this disk: a checkpoint takes its room twice (the
    # staged file, kept in the cache once uploaded, and the stored object). Room for the
    # first (step 10) that way, not for staging the second.
    filler = fill(disk_stack.settings.artifacts_path, leave_bytes=checkpoint_bytes * 5 // 2)
    try:
        job_id = disk_stack.create(**SPEC)
        failed = disk_stack.wait(job_id, timeout=120)
        listed, problems = listed_steps(disk_stack, job_id), disk_stack.checkpoint_problems(job_id)
    finally:
        filler.unlink()
    error = failed.error or {}
    after_fix = resume_after_fix(disk_stack, job_id, reference_id, reference_weights)
    record_figure(
        f"disk_full_{disk_stack.name}", area="fault",
        check=f"Artefact disk full at a checkpoint write (tmpfs, {disk_stack.name})",
        figure=f"job {failed.status} with {error.get('type')}; previous checkpoint(s) {listed} "
               f"listed, {len(problems)} missing/partial/orphan files; after freeing space "
               f"resumed with {len(after_fix)} differences from an uninterrupted run",
        passed=failed.status == "failed" and listed == [10] and not problems and not after_fix,
    )
    assert failed.status == "failed", failed.status
    assert error.get("type") == "CheckpointWriteError", error
    for words in ("No space left on device", f"{job_id}/20.pt", resume_hint(job_id)):
        assert words in error["message"], (words, error["message"])
    assert listed == [10] and not problems, (listed, problems)
    assert not after_fix, after_fix


@pytest.mark.slow
def test_read_only_artifacts_dir_at_checkpoint_keeps_the_previous_one(
    disk_stack: Stack, reference: tuple[str, int], reference_weights: dict[str, Any],
    record_figure: Any,
) -> None:
    reference_id, _ = reference
    artifacts = disk_stack.settings.artifacts_path
    # A first attempt that leaves checkpoints: cancelled once one is listed.
    job_id = disk_stack.create(**SPEC)
    disk_stack.wait(job_id, ("running",), check=lambda _: listed_steps(disk_stack, job_id))
    disk_stack.cancel(job_id)
    assert disk_stack.wait(job_id).status == "cancelled", "raise max_steps: the job ended first"
    before = listed_steps(disk_stack, job_id)

    remount(artifacts, "ro")
    try:
        disk_stack.resume(job_id)
        failed = disk_stack.wait(job_id, timeout=120)
        listed, problems = listed_steps(disk_stack, job_id), disk_stack.checkpoint_problems(job_id)
    finally:
        remount(artifacts, "rw")
    error = failed.error or {}
    after_fix = resume_after_fix(disk_stack, job_id, reference_id, reference_weights)
    record_figure(
        f"artifacts_unwritable_{disk_stack.name}", area="fault",
        check=f"Artefact directory read-only at a checkpoint write (tmpfs remounted ro, "
              f"{disk_stack.name})",
        figure=f"job {failed.status} with {error.get('type')}; previous checkpoints {listed} "
               f"listed, {len(problems)} missing/partial/orphan files; after remounting rw "
               f"resumed with {len(after_fix)} differences from an uninterrupted run",
        passed=failed.status == "failed" and listed == before and not problems and not after_fix,
    )
    assert failed.status == "failed", failed.status
    assert error.get("type") == "CheckpointWriteError", error
    # The file it could not write: this node's staging copy of one of the job's checkpoints.
    for words in ("Read-only file system", job_id, resume_hint(job_id)):
        assert words in error["message"], (words, error["message"])
    assert re.search(r"could not write checkpoint \S+\.pt", error["message"]), error["message"]
    assert listed == before and not problems, (before, listed, problems)
    assert not after_fix, after_fix
