"""Metrics: idempotent batched writes, superseding after a resume, keyset reads, downsampling."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import datetime

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import downsample, metrics
from services.jobdb.errors import InvalidCursor
from services.jobdb.metric_blocks import BLOCK_STEPS
from services.jobdb.models import Job, MetricBlock
from services.jobdb.nonfinite import label


def write(
    session_factory: sessionmaker[Session], job_id: str, attempt: int, rows: list[dict]
) -> None:
    with session_factory.begin() as session:
        metrics.write_metrics(session, job_id, attempt, rows)


def all_metrics(session_factory: sessionmaker[Session], job_id: str, **filters) -> list[tuple]:
    with session_factory() as session:
        rows, cursor = metrics.read_metrics(session, job_id, limit=100_000, **filters)
    assert cursor is None
    return [(m.name, m.step, m.epoch, m.value, m.attempt) for m in rows]


def test_write_and_read_one_step(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    step_metrics = {"step": 3.0, "epoch": 1.0, "loss": 0.25, "lr": 0.1, "grad_norm": 2, "note": "x"}
    write(session_factory, job.id, 1, metrics.metric_rows(3, 1, step_metrics))
    assert all_metrics(session_factory, job.id) == [
        ("grad_norm", 3, 1, 2.0, 1),
        ("loss", 3, 1, 0.25, 1),
        ("lr", 3, 1, 0.1, 1),
    ]
    with session_factory() as session:
        (row,), _ = metrics.read_metrics(session, job.id, name="loss")
        assert row.ts.tzinfo is not None
        assert metrics.metric_names(session, job.id) == ["grad_norm", "loss", "lr"]
        assert metrics.latest_steps(session, job.id) == {"grad_norm": 3, "loss": 3, "lr": 3}


def test_nan_is_stored_as_null_and_infinities_as_themselves(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    """SQLite cannot hold a NaN (it becomes NULL), so a NULL value is a NaN on both backends;
    +-inf survive (PostgreSQL's JSON batch carries them as strings)."""
    job = make_job()
    write(
        session_factory,
        job.id,
        1,
        [
            {"name": "loss", "step": s, "value": v}
            for s, v in [(1, math.nan), (2, math.inf), (3, -math.inf), (4, 1.5)]
        ],
    )
    assert [value for *_, value, _ in all_metrics(session_factory, job.id)] == [
        None, math.inf, -math.inf, 1.5,
    ]
    with session_factory() as session:
        assert [label(m.value) for m in downsample.downsample_metrics(session, job.id, "loss", 10)] == [
            "NaN", "inf", "-inf", None,
        ]


def test_a_diverged_tail_survives_downsampling(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    """A long run whose loss went NaN at step 4,001: the downsample keeps the numbers' extremes
    and the first and last step of the NaN run, within max_points."""
    job = make_job()
    points = [(s, 1 / s if s <= 4000 else math.nan) for s in range(1, 4011)]
    write(session_factory, job.id, 1, [{"name": "loss", "step": s, "value": v} for s, v in points])
    with session_factory() as session:
        sampled = downsample.downsample_metrics(session, job.id, "loss", max_points=50)
    assert len(sampled) <= 50
    assert [m.step for m in sampled if m.value is None] == [4001, 4010]
    assert sampled[0].step == 1 and max(m.step for m in sampled if m.value is not None) == 4000


def test_rewriting_a_step_keeps_one_row_with_the_latest_value(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    write(session_factory, job.id, 1, [{"name": "loss", "step": 1, "value": 1.0}])
    write(
        session_factory,
        job.id,
        1,
        [{"name": "loss", "step": 1, "value": 2.0}, {"name": "loss", "step": 1, "value": 3.0}],
    )  # same batch too
    assert all_metrics(session_factory, job.id) == [("loss", 1, None, 3.0, 1)]


def test_a_resumed_attempt_supersedes_its_predecessor_after_the_checkpoint(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    """Attempt 1 logs steps 1..13 and dies; its checkpoint is at step 10. Attempt 2 resumes
    from 10, drops 11..13 and logs 11..20: each (name, step) appears once, the newest wins."""
    job = make_job()
    rows = lambda steps, value: [  # noqa: E731
        row for s in steps for row in metrics.metric_rows(s, s // 5, {"loss": value + s, "lr": 0.1})
    ]
    write(session_factory, job.id, 1, rows(range(1, 14), 0.0))
    with session_factory.begin() as session:
        assert metrics.delete_metrics_after(session, job.id, 10) == 2 * 3
    write(session_factory, job.id, 2, rows(range(11, 21), 100.0))
    with session_factory() as session:
        assert metrics.latest_steps(session, job.id) == {"loss": 20, "lr": 20}
    stored = all_metrics(session_factory, job.id, name="loss")
    assert [step for _, step, *_ in stored] == list(range(1, 21))
    assert [(value, attempt) for *_, value, attempt in stored] == (
        [(float(s), 1) for s in range(1, 11)] + [(100.0 + s, 2) for s in range(11, 21)]
    )
    assert len(all_metrics(session_factory, job.id)) == 2 * 20


def test_keyset_pages_cover_every_row_once(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job, other = make_job(seed=1), make_job(seed=2)
    rows = [
        row
        for s in range(1, 26)
        for row in metrics.metric_rows(s, 0, {"loss": s, "acc": -s, "lr": 1})
    ]
    write(session_factory, job.id, 1, rows)
    write(session_factory, other.id, 1, rows[:5])
    for name, since_step, expected in [
        (None, None, 75),
        ("loss", None, 25),
        ("acc", 20, 5),
        (None, 24, 3),
        (None, 10, 45),  # pages that end inside one name and go on in the next
    ]:
        seen: list[tuple[str, int]] = []
        cursor = None
        with session_factory() as session:
            while True:
                page, cursor = metrics.read_metrics(
                    session, job.id, name=name, since_step=since_step, limit=7, cursor=cursor
                )
                assert len(page) <= 7
                seen += [(m.name, m.step) for m in page]
                if cursor is None:
                    break
        assert len(seen) == expected and seen == sorted(set(seen))
        assert all(name in (None, n) and (since_step is None or s > since_step) for n, s in seen)


def test_bad_reads_are_refused(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    with session_factory() as session:
        with pytest.raises(InvalidCursor):
            metrics.read_metrics(session, job.id, cursor="eyJ4IjoxfQ")  # valid base64, wrong shape
        with pytest.raises(ValueError, match="limit"):
            metrics.read_metrics(session, job.id, limit=0)
        with pytest.raises(ValueError, match="max_points must be at least 2"):
            downsample.downsample_metrics(session, job.id, "loss", 1)
        with pytest.raises(ValueError, match="must be >= 0"):
            metrics.write_metrics(session, job.id, 1, [{"name": "x", "step": -1, "value": 1.0}])
        with pytest.raises(ValueError, match="1 to 100 characters"):
            metrics.write_metrics(
                session, job.id, 1, [{"name": "x" * 101, "step": 1, "value": 1.0}]
            )
        with pytest.raises(ValueError, match="no time zone"):
            naive = datetime(2026, 1, 1)  # noqa: DTZ001 (the mistake under test)
            metrics.write_metrics(
                session, job.id, 1, [{"name": "x", "step": 1, "value": 1.0, "ts": naive}]
            )


def min_and_max_of(grouped: dict[int, list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Each group's lowest and highest point (earliest step on ties), sorted by step."""
    kept = set()
    for members in grouped.values():
        kept.add(min(members, key=lambda p: (p[1], p[0])))
        kept.add(min(members, key=lambda p: (-p[1], p[0])))
    return sorted(kept)


def reference_min_max(points: list[tuple[int, float]], max_points: int) -> list[tuple[int, float]]:
    """The oracle: equal step buckets, each keeping its lowest and highest point."""
    buckets = max_points // 2
    lo, hi = points[0][0], points[-1][0]
    grouped: dict[int, list[tuple[int, float]]] = {}
    for step, value in points:
        grouped.setdefault((step - lo) * buckets // (hi - lo + 1), []).append((step, value))
    return min_and_max_of(grouped)


def test_downsampling_keeps_each_buckets_min_and_max(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    rng = random.Random(0)
    points = [(s, math.exp(-s / 2000) + rng.gauss(0, 0.05)) for s in range(1, 5001)]
    points[1234] = (1235, 25.0)  # a loss spike that striding or averaging would hide
    points[3000] = (3001, -3.0)
    write(session_factory, job.id, 1, [{"name": "loss", "step": s, "value": v} for s, v in points])
    with session_factory() as session:
        sampled = downsample.downsample_metrics(session, job.id, "loss", max_points=200)
        few = downsample.downsample_metrics(session, job.id, "loss", max_points=10_000)
    got = [(m.step, m.value) for m in sampled]
    assert 100 < len(got) <= 200
    assert got == reference_min_max(points, 200)
    assert (1235, 25.0) in got and (3001, -3.0) in got
    assert [m.step for m in few] == [s for s, _ in points]  # fewer points than asked: all of them


def test_values_round_trip_exactly(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    values = [0.1 + 0.2, 1e-300, -123456789.123456789, 2.0**-1074, 1.7976931348623157e308, 0.0]
    write(
        session_factory,
        job.id,
        1,
        [{"name": "x", "step": i, "value": v} for i, v in enumerate(values)],
    )
    assert [value for *_, value, _ in all_metrics(session_factory, job.id)] == values


def blocks_of(session_factory: sessionmaker[Session], job_id: str) -> list[tuple]:
    with session_factory() as session:
        rows = session.scalars(
            select(MetricBlock)
            .where(MetricBlock.job_id == job_id)
            .order_by(MetricBlock.name, MetricBlock.block)
        )
        return [
            (b.name, b.block, b.count, b.min_step, b.min_value, b.max_step, b.max_value)
            for b in rows
        ]


def reference_from_blocks(
    points: list[tuple[int, float]], max_points: int
) -> list[tuple[int, float]]:
    """The oracle for long curves: a bucket is the blocks whose first step falls in it."""
    buckets = max_points // 2
    lo, hi = points[0][0], points[-1][0]
    grouped: dict[int, list[tuple[int, float]]] = {}
    for step, value in points:
        block_start = step // BLOCK_STEPS * BLOCK_STEPS
        grouped.setdefault(max(0, block_start - lo) * buckets // (hi - lo + 1), []).append(
            (step, value)
        )
    return min_and_max_of(grouped)


def test_long_curves_downsample_from_blocks_keeping_min_and_max(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    rng = random.Random(1)
    points = [(s, 1 / (1 + s / 500) + rng.gauss(0, 0.02)) for s in range(3, 10_003)]
    points[3777] = (3780, 9.0)
    points[7000] = (7003, -9.0)
    for start in range(0, len(points), 1000):  # the worker's batches
        write(
            session_factory,
            job.id,
            1,
            [{"name": "loss", "step": s, "value": v} for s, v in points[start : start + 1000]],
        )
    assert len(points) // 25 >= 2 * BLOCK_STEPS  # buckets two blocks wide: the block path
    with session_factory() as session:
        sampled = downsample.downsample_metrics(session, job.id, "loss", max_points=50)
    got = [(m.step, m.value) for m in sampled]
    assert 25 < len(got) <= 50
    assert got == reference_from_blocks(points, 50)
    assert (3780, 9.0) in got and (7003, -9.0) in got


def test_blocks_after_a_resume_equal_blocks_written_once(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    """The per-block extremes stay exact through overwrites and deletes: a job whose history
    was superseded has the same blocks (and downsampled curve) as one written in one go."""
    resumed, fresh = make_job(seed=1), make_job(seed=2)
    first = [(s, math.sin(s / 300)) for s in range(1, 3001)]
    final = first[:1500] + [(s, math.cos(s / 200) - 1) for s in range(1501, 4001)]

    def rows(pts: list[tuple[int, float]]) -> list[dict]:
        return [
            row for s, v in pts for row in metrics.metric_rows(s, 0, {"loss": v, "lr": 0.1 + s % 7})
        ]

    for start in range(0, 3000, 700):
        write(session_factory, resumed.id, 1, rows(first[start : start + 700]))
    with session_factory.begin() as session:
        metrics.delete_metrics_after(session, resumed.id, 1500)
    for start in range(1500, 4000, 900):
        write(session_factory, resumed.id, 2, rows(final[start : start + 900]))
    write(session_factory, fresh.id, 1, rows(final))
    assert blocks_of(session_factory, resumed.id) == blocks_of(session_factory, fresh.id)
    with session_factory() as session:
        curves = [
            [(m.step, m.value) for m in downsample.downsample_metrics(session, job.id, "loss", 40)]
            for job in (resumed, fresh)
        ]
    assert curves[0] == curves[1] and len(curves[0]) <= 40
    with session_factory.begin() as session:
        metrics.delete_metrics_after(session, resumed.id, None)
    assert blocks_of(session_factory, resumed.id) == []


def test_a_metric_logged_only_after_the_checkpoint_leaves_no_block(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    write(
        session_factory,
        job.id,
        1,
        [{"name": "loss", "step": s, "value": 1.0} for s in range(1, 11)],
    )
    write(session_factory, job.id, 1, [{"name": "val_loss", "step": 8, "value": 2.0}])
    with session_factory.begin() as session:
        metrics.delete_metrics_after(session, job.id, 5)
    assert blocks_of(session_factory, job.id) == [("loss", 0, 5, 1, 1.0, 1, 1.0)]


# The API's hot paths: a dashboard's poll of every name after a step (``since_step`` without
# ``name``), and a live stream's read of each name past its own frontier.
NAMES = ("grad_norm", "loss", "lr")


def job_with_curves(session_factory: sessionmaker[Session], make_job: Callable[..., Job], steps: int) -> str:
    job = make_job()
    rows = [{"name": n, "step": s, "epoch": 0, "value": s / 10} for s in range(1, steps + 1) for n in NAMES]
    rows.append({"name": "val_loss", "step": 5, "epoch": 0, "value": 0.5})
    with session_factory.begin() as session:
        metrics.write_metrics(session, job.id, 1, rows)
    return job.id


def test_since_step_without_a_name_pages_every_name_after_the_step(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job_id = job_with_curves(session_factory, make_job, steps=10)
    with session_factory() as session:
        first, cursor = metrics.read_metrics(session, job_id, since_step=7, limit=5)
        rest, end = metrics.read_metrics(session, job_id, since_step=7, limit=5, cursor=cursor)
        nothing, _ = metrics.read_metrics(session, job_id, since_step=10)
    got = [(m.name, m.step) for m in first + rest]
    assert got == [(n, s) for n in NAMES for s in (8, 9, 10)]  # val_loss (step 5) is before 7
    assert end is None and nothing == []


def test_new_points_start_past_each_names_frontier(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job_id = job_with_curves(session_factory, make_job, steps=10)
    frontiers = {"loss": 8, "lr": None, "val_loss": 5, "grad_norm": 10}
    with session_factory() as session:
        rows = metrics.read_new_points(session, job_id, frontiers, limit=1000)
        cut = metrics.read_new_points(session, job_id, frontiers, limit=3)
        none = metrics.read_new_points(session, job_id, {}, limit=1000)
    assert [(m.name, m.step) for m in rows] == [("loss", 9), ("loss", 10)] + [("lr", s) for s in range(1, 11)]
    assert [m.value for m in rows[:2]] == [0.9, 1.0]
    # A cut page keeps (name, step) order: the names after the cut come next time.
    assert [(m.name, m.step) for m in cut] == [("loss", 9), ("loss", 10), ("lr", 1)]
    assert none == []
