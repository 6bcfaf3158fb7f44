"""Downsampling one metric's history to at most ``max_points`` points that keep its shape.

The step range is cut into ``max_points // 2`` equal buckets and each bucket keeps its lowest
and its highest point, so spikes and dips survive (unlike averaging or striding). Long curves
read the per-block extremes in ``metric_blocks`` (one row per 64 steps) instead of every
point; short ones, or buckets narrower than two blocks, read the points. Read-only.

Non-finite points (services/jobdb/nonfinite.py) are kept where a reader needs them to see a
run diverge: a short history has every point; in a long one, +-inf are values like any
other (so a bucket's extreme), and a NaN tail (a diverged run: the trainer stops it within a
few steps) keeps its first and last point. A NaN in the middle of a long run's bucket is not
kept (finding it would read every row); the job's events say where steps were skipped.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Double, cast, func, select, text
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.orm import Session

from services.jobdb.metric_blocks import BLOCK_STEPS
from services.jobdb.metrics import POINT, Point
from services.jobdb.models import Metric, MetricBlock


def downsample_metrics(
    session: Session, job_id: str, name: str, max_points: int
) -> list[Point]:
    """At most ``max_points`` points of metric ``name``, in step order, keeping each bucket's
    minimum and maximum. Fewer points than ``max_points``: all of them, NaN (NULL) included;
    otherwise buckets of the numbers, and the first and last step of a NaN tail.
    Points are rows of the ``metrics.POINT`` columns, as ``metrics.read_metrics`` returns.

    With buckets at least two blocks wide, a bucket is the set of blocks whose first step falls
    in its step range (``bucket_of_block``): its extremes are exact over those blocks.
    """
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2 (a min and a max), got {max_points}")
    every_row = (Metric.job_id == job_id, Metric.name == name)
    of_metric = (*every_row, Metric.value.is_not(None))
    # Counting stops at max_points + 1 rows: a short curve costs one index range.
    probe = select(Metric.step).where(*every_row).limit(max_points + 1).subquery()
    if (session.scalar(select(func.count()).select_from(probe)) or 0) <= max_points:
        return list(session.execute(select(*POINT).where(*every_row).order_by(Metric.step)))
    tail = _nan_tail(session, every_row)
    # Two ends of the primary-key range; min()/max() with the NULL filter would read all rows.
    first = select(Metric.step).where(*of_metric).order_by(Metric.step).limit(1)
    lo = session.scalar(first)
    hi = session.scalar(first.order_by(None).order_by(Metric.step.desc()))
    buckets = (max_points - len(tail)) // 2
    if lo is None or hi is None or buckets < 1:  # nothing but NaN, or no room beside the tail
        return _points_at(session, job_id, name, tail)
    if (hi - lo + 1) // buckets >= 2 * BLOCK_STEPS:
        steps = _extremes_from_blocks(session, job_id, name, lo, hi, buckets)
    else:
        bucket = cast(Metric.step - lo, BigInteger) * buckets // (hi - lo + 1)
        steps = _extremes_from_points(session, of_metric, bucket)
    return _points_at(session, job_id, name, sorted(steps | set(tail)))


def _nan_tail(session: Session, every_row: tuple[Any, ...]) -> list[int]:
    """The first and last step of the NaN run that ends the metric, as far as its last
    ``BLOCK_STEPS`` rows show it (an index range read backwards); [] if it ends in a number."""
    last = session.execute(
        select(Metric.step, Metric.value)
        .where(*every_row)
        .order_by(Metric.step.desc())
        .limit(BLOCK_STEPS)
    ).all()
    run = []
    for step, value in last:
        if value is not None:
            break
        run.append(step)
    return sorted({run[0], run[-1]}) if run else []


# The steps arrive as one array; each is looked up by the full primary key. (With a plain
# IN list the planner, lacking statistics for a fresh job, may filter all rows instead.)
_PG_POINTS_AT = text(
    """
    SELECT m.name, m.step, m.epoch, m.value, m.ts, m.attempt
    FROM unnest(CAST(:steps AS integer[])) AS wanted(step)
    CROSS JOIN LATERAL (
        SELECT * FROM metrics WHERE job_id = :job_id AND name = :name AND step = wanted.step
        LIMIT 1  -- keeps the subquery a per-step probe (the planner cannot flatten it)
    ) AS m
    ORDER BY m.step
    """
)


def _points_at(session: Session, job_id: str, name: str, steps: list[int]) -> list[Point]:
    if session.get_bind().dialect.name == "postgresql":
        statement = _PG_POINTS_AT.bindparams(steps=steps, job_id=job_id, name=name)
        return list(session.execute(statement.columns(*POINT)))
    query = (
        select(*POINT)
        .where(Metric.job_id == job_id, Metric.name == name, Metric.step.in_(steps))
        .order_by(Metric.step)
    )
    return list(session.execute(query))


def bucket_of_block(block: int, lo: int, hi: int, buckets: int) -> int:
    """The bucket a block belongs to: the one holding its first step (the first block, which
    may start before ``lo``, goes to bucket 0)."""
    return max(0, block * BLOCK_STEPS - lo) * buckets // (hi - lo + 1)


def _extremes_from_blocks(
    session: Session, job_id: str, name: str, lo: int, hi: int, buckets: int
) -> set[int]:
    rows = session.execute(
        select(
            MetricBlock.block,
            MetricBlock.min_value,
            MetricBlock.min_step,
            MetricBlock.max_value,
            MetricBlock.max_step,
        ).where(MetricBlock.job_id == job_id, MetricBlock.name == name)
    )
    lowest: dict[int, tuple[float, int]] = {}
    highest: dict[int, tuple[float, int]] = {}
    for block, min_value, min_step, max_value, max_step in rows:
        bucket = bucket_of_block(block, lo, hi, buckets)
        # Ties go to the earliest step, as within a block.
        if bucket not in lowest or (min_value, min_step) < lowest[bucket]:
            lowest[bucket] = (min_value, min_step)
        if bucket not in highest or (-max_value, max_step) < highest[bucket]:
            highest[bucket] = (-max_value, max_step)
    return {step for _, step in lowest.values()} | {step for _, step in highest.values()}


def _extremes_from_points(session: Session, of_metric: tuple[Any, ...], bucket: Any) -> set[int]:
    """The steps of each bucket's lowest and highest value, in one GROUP BY."""
    if session.get_bind().dialect.name == "postgresql":
        # Arrays compare element by element: min([value, step]) is the lowest value's row,
        # max([value, -step]) the highest value's (earliest step on ties).
        low = func.min(array((Metric.value, cast(Metric.step, Double))))
        high = func.max(array((Metric.value, -cast(Metric.step, Double))))
        rows = session.execute(select(low, high).where(*of_metric).group_by(bucket)).all()
        return {int(lo[1]) for lo, _ in rows} | {int(-hi[1]) for _, hi in rows}
    # SQLite: with a single min() or max(), a bare column comes from the row holding it.
    steps: set[int] = set()
    for extreme in (func.min, func.max):
        query = select(Metric.step, extreme(Metric.value)).where(*of_metric).group_by(bucket)
        steps |= {row[0] for row in session.execute(query)}
    return steps
