"""Per-block minimum and maximum of each metric, kept exact as metrics are written.

A block is ``BLOCK_STEPS`` consecutive steps. Downsampling a long curve reads one
``metric_blocks`` row per block (1,563 rows for 100,000 steps) instead of every point, which
keeps ``max_points`` reads fast however long the run. Every write or delete recomputes the
blocks it touched from the metric rows themselves, so the table never drifts from them.
Functions here flush but never commit.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import delete, insert, select, text
from sqlalchemy.orm import Session

from services.jobdb.models import Metric, MetricBlock

BLOCK_STEPS = 64

_PG_REFRESH = text(
    f"""
    INSERT INTO metric_blocks
        (job_id, name, block, count, min_step, min_value, max_step, max_value)
    SELECT :job_id, name, block, n, (lo)[2]::integer, (lo)[1], (-(hi)[2])::integer, (hi)[1]
    FROM (
        -- Arrays compare element by element: min([value, step]) is the lowest value's row
        -- (earliest on ties), max([value, -step]) the highest value's (earliest on ties).
        SELECT name, step / {BLOCK_STEPS} AS block, count(*) AS n,
               min(ARRAY[value, step::double precision]) AS lo,
               max(ARRAY[value, -step::double precision]) AS hi
        FROM metrics
        WHERE job_id = :job_id AND name = ANY(:names) AND step BETWEEN :first AND :last
              AND value IS NOT NULL
        GROUP BY name, step / {BLOCK_STEPS}
    ) AS per_block
    """
)


def refresh_blocks(
    session: Session, job_id: str, names: Collection[str], first_step: int, last_step: int
) -> None:
    """Recompute the blocks of ``names`` that contain any step in [first_step, last_step]."""
    if not names:
        return
    postgres = session.get_bind().dialect.name == "postgresql"
    if postgres:
        # Two writers of one job (a worker and the zombie it replaced) must not both rebuild a
        # block from snapshots that miss each other's rows: the later one waits here until
        # the earlier commits, then recomputes from everything. Held until commit. (SQLite
        # already runs one writer at a time.)
        session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:job_id))"), {"job_id": job_id})
    first_block, last_block = first_step // BLOCK_STEPS, last_step // BLOCK_STEPS
    first, last = first_block * BLOCK_STEPS, (last_block + 1) * BLOCK_STEPS - 1
    session.execute(
        delete(MetricBlock).where(
            MetricBlock.job_id == job_id,
            MetricBlock.name.in_(names),
            MetricBlock.block.between(first_block, last_block),
        )
    )
    params = {"job_id": job_id, "names": list(names), "first": first, "last": last}
    if postgres:
        session.execute(_PG_REFRESH, params)
        return
    rows = session.execute(
        select(Metric.name, Metric.step, Metric.value)
        .where(
            Metric.job_id == job_id,
            Metric.name.in_(names),
            Metric.step.between(first, last),
            Metric.value.is_not(None),
        )
        .order_by(Metric.name, Metric.step)
    )
    blocks: dict[tuple[str, int], dict[str, Any]] = {}
    for name, step, value in rows:  # in step order: strict comparisons keep the earliest tie
        block = blocks.get((name, step // BLOCK_STEPS))
        if block is None:
            blocks[(name, step // BLOCK_STEPS)] = {
                "job_id": job_id,
                "name": name,
                "block": step // BLOCK_STEPS,
                "count": 1,
                "min_step": step,
                "min_value": value,
                "max_step": step,
                "max_value": value,
            }
            continue
        block["count"] += 1
        if value < block["min_value"]:
            block["min_step"], block["min_value"] = step, value
        if value > block["max_value"]:
            block["max_step"], block["max_value"] = step, value
    if blocks:
        session.execute(insert(MetricBlock), list(blocks.values()))


def delete_blocks_after(
    session: Session, job_id: str, step: int | None, names: Collection[str]
) -> None:
    """Follow ``delete_metrics_after``: drop later blocks, recompute the one cut in two."""
    query = delete(MetricBlock).where(MetricBlock.job_id == job_id)
    if step is None:
        session.execute(query)
        return
    # The block holding `step` goes too (for every name: a name may have no rows left in it),
    # then is rebuilt from the rows that remain for the names still present.
    session.execute(query.where(MetricBlock.block >= step // BLOCK_STEPS))
    refresh_blocks(session, job_id, names, step, step)
