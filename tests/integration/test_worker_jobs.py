"""A real worker process runs jobs end to end, on SQLite + embedded broker and on PostgreSQL +
Redis: success with every metric step once and the retained checkpoints, cancel of a queued and
of a running job (checkpointed where it stopped, resumed from there), a duplicate message, and
a failing spec that is not retried."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from services.jobdb import checkpoints, metrics


def metric_steps(stack: Any, job_id: str, name: str) -> list[int]:
    with stack.sessions() as session:
        rows, _ = metrics.read_metrics(session, job_id, name=name, limit=100_000)
        return [row.step for row in rows]


def checkpoint_steps(stack: Any, job_id: str) -> list[int]:
    with stack.sessions() as session:
        return [c.step for c in checkpoints.list_checkpoints(session, job_id)]


def test_job_succeeds_with_every_step_logged_and_checkpoints_retained(stack: Any) -> None:
    job_id = stack.create(max_steps=12, checkpoint_every=4, keep_checkpoints=2, eval_every=4)
    job = stack.wait(job_id)
    assert job.status == "succeeded", (job.error, stack.worker_logs())
    assert job.attempts == 1 and job.started_at and job.finished_at and job.worker_host
    assert job.progress["optimizer_step"] == job.progress["total_optimizer_steps"] == 12
    assert {"loss", "lr", "grad_norm", "val_loss"} <= set(job.latest_metrics)
    assert metric_steps(stack, job_id, "loss") == list(range(1, 13))
    assert metric_steps(stack, job_id, "val_loss") == [4, 8, 12]
    # Checkpoints at 4, 8, 12: keep the last 2, plus the best by val_loss if older.
    with stack.sessions() as session:
        rows = checkpoints.list_checkpoints(session, job_id)
    val = {c.step: c.metrics["val_loss"] for c in rows}
    best = min(val, key=val.__getitem__)
    assert {8, 12} <= set(val) and set(val) <= {4, 8, 12}
    assert (4 in val) == (best == 4)
    files = sorted(int(p.stem) for p in (stack.settings.artifacts_path / job_id).glob("*.pt"))
    assert files == sorted(val)
    assert [c.key for c in rows] == [f"{job_id}/{c.step}.pt" for c in rows]  # keys, not paths
    state = torch.load(stack.settings.artifacts_path / rows[-1].key, weights_only=True)
    assert set(state["model"]) and state["progress"]["step"] == 12
    kinds = stack.event_kinds(job_id)
    assert kinds[:2] == ["created", "started"] and kinds[-1] == "succeeded"
    assert kinds.count("checkpoint") == 3


def test_cancelled_queued_job_is_skipped_when_its_message_arrives(stack: Any) -> None:
    cancelled = stack.create(enqueue=False)
    assert stack.cancel(cancelled) == "cancelled"
    from services.dispatch.enqueue import enqueue_job

    enqueue_job(stack.settings, cancelled, stack.queue)
    after = stack.create(max_steps=2)  # the single worker takes messages in order
    assert stack.wait(after).status == "succeeded"
    job = stack.job(cancelled)
    assert job.status == "cancelled" and job.attempts == 0 and job.started_at is None
    assert "started" not in stack.event_kinds(cancelled)


def test_cancel_keeps_the_work_and_resume_continues_from_the_cancel_step(stack: Any) -> None:
    """Issue 15: a cancelled running job is checkpointed at the window it finished last (the
    SIGTERM path), keeps its metrics, and `resume` continues from there, not from the start."""
    job_id = stack.create(max_steps=100_000, checkpoint_every=100_000)
    stack.wait(job_id, ("running",), check=lambda j: (j.progress or {}).get("optimizer_step", 0) > 0)
    assert stack.cancel(job_id) == "cancelling"
    job = stack.wait(job_id, timeout=30)
    assert job.status == "cancelled"
    stopped_at = job.progress["optimizer_step"]
    assert 0 < stopped_at < 100_000
    assert checkpoint_steps(stack, job_id) == [stopped_at]  # not a partial window: a boundary
    assert stack.checkpoint_problems(job_id) == []
    state = torch.load(stack.settings.artifacts_path / job_id / f"{stopped_at}.pt", weights_only=True)
    assert state["progress"]["step"] == stopped_at
    kinds = stack.event_kinds(job_id)
    assert kinds.index("cancel_requested") < kinds.index("checkpoint") < kinds.index("cancelled")
    # The metrics of every step it finished are there, once each.
    assert metric_steps(stack, job_id, "loss") == list(range(1, stopped_at + 1))

    stack.resume(job_id)
    resumed = stack.wait(
        job_id, ("running",),
        check=lambda j: j.attempts == 2 and (j.progress or {}).get("optimizer_step", 0) > stopped_at,
    )
    assert resumed.resume_step == stopped_at
    assert stack.cancel(job_id) == "cancelling"
    again = stack.wait(job_id, timeout=30)
    steps = stack.metric_steps(job_id)
    # Attempt 1's steps kept, attempt 2 went on from the next one: every step once.
    assert [s for s, _ in steps] == list(range(1, again.progress["optimizer_step"] + 1))
    assert {a for s, a in steps if s <= stopped_at} == {1}
    assert {a for s, a in steps if s > stopped_at} == {2}


def test_message_delivered_twice_runs_the_job_once(stack: Any) -> None:
    from services.dispatch.enqueue import enqueue_job

    job_id = stack.create(max_steps=6)
    enqueue_job(stack.settings, job_id, stack.queue)  # a duplicate of the nudge
    assert stack.wait(job_id).status == "succeeded"
    marker = stack.create(max_steps=1)  # queued behind the duplicate: it has been consumed
    assert stack.wait(marker).status == "succeeded"
    job = stack.job(job_id)
    assert job.status == "succeeded" and job.attempts == 1
    assert stack.event_kinds(job_id).count("started") == 1
    assert metric_steps(stack, job_id, "loss") == list(range(1, 7))


def test_missing_data_root_fails_clearly_and_is_not_retried(stack: Any, tmp_path: Path) -> None:
    root = stack.settings.home / "data" / f"no-such-data-{tmp_path.name}"  # allowed, absent
    job_id = stack.create(dataset={"name": "mnist", "data_root": str(root)})
    job = stack.wait(job_id)
    assert job.status == "failed"
    assert job.error["type"] == "DatasetUnavailable"
    assert str(root) in job.error["message"] and "download" in job.error["message"]
    marker = stack.create(max_steps=1)
    assert stack.wait(marker).status == "succeeded"
    job = stack.job(job_id)
    assert job.status == "failed" and job.attempts == 1
    kinds = stack.event_kinds(job_id)
    assert "traceback" in kinds and kinds.count("started") == 1
