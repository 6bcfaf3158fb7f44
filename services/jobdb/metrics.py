"""Per-step metrics: batched idempotent writes and the one reader of the ``metrics`` table.

    metrics.write_metrics(session, job_id, attempt, metrics.metric_rows(step, epoch, values))
    rows, next_cursor = metrics.read_metrics(session, job_id, name="loss", since_step=100)
    rows = metrics.read_new_points(session, job_id, {"loss": 120, "lr": None}, limit=1000)

Reads return plain rows (``name``, ``step``, ``epoch``, ``value``, ``ts``, ``attempt``: the
``POINT`` columns), not ORM objects: about 3x cheaper for a 1000-point page, which is what a
dashboard polls. The per-block extremes that writes keep up to date live in ``metric_blocks``;
a shape-keeping downsample of a long curve is ``downsample.downsample_metrics``.
Functions here flush but never commit: the worker commits once per batch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Row, Select, and_, delete, or_, select, text, tuple_
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from services.jobdb.cursors import decode_cursor, encode_cursor
from services.jobdb.metric_blocks import delete_blocks_after, refresh_blocks
from services.jobdb.models import Metric
from services.jobdb.types import utcnow

MAX_NAME_LENGTH = 100  # the column's width
# What every read returns, one row per point.
POINT = (Metric.name, Metric.step, Metric.epoch, Metric.value, Metric.ts, Metric.attempt)
Point = Row[str, int, int | None, float | None, datetime, int]
PointQuery = Select[str, int, int | None, float | None, datetime, int]


def metric_rows(
    step: int, epoch: int | float | None, values: Mapping[str, Any], ts: datetime | None = None
) -> list[dict[str, Any]]:
    """Rows for ``write_metrics`` from one step's ``{name: value}`` (e.g. a trainer's on_step
    metrics; the ``step`` and ``epoch`` keys and non-numeric values are skipped)."""
    ts = ts or utcnow()
    return [
        {"name": name, "step": step, "epoch": epoch, "value": value, "ts": ts}
        for name, value in values.items()
        if name not in ("step", "epoch")
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    ]


def _aware(ts: datetime | None) -> datetime | None:
    if ts is not None and ts.tzinfo is None:
        raise ValueError(f"metric ts {ts!r} has no time zone: pass datetime.now(UTC)")
    return ts


def _storable(value: Any) -> float | None:
    """NaN (and None) as NULL, which SQLite makes of a NaN anyway; +-inf and numbers as floats
    (services/jobdb/nonfinite.py)."""
    value = float(value) if value is not None else None
    return None if value is None or math.isnan(value) else value


def _json_number(value: float | None) -> float | str | None:
    """A value for the JSON document PostgreSQL unpacks: JSON has no infinity, but a string
    such as "Infinity" is read by double precision's own input function."""
    if value is not None and math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


# One statement whatever the batch size: the rows travel as one JSON document that PostgreSQL
# unpacks in C (far cheaper than binding thousands of parameters or arrays from Python).
_PG_UPSERT = text(
    """
    INSERT INTO metrics (job_id, name, step, attempt, epoch, value, ts)
    SELECT :job_id, r.name, r.step, :attempt, r.epoch, r.value, r.ts
    FROM json_to_recordset(CAST(:rows AS json))
        AS r(name text, step integer, epoch integer, value double precision, ts timestamptz)
    ON CONFLICT (job_id, name, step) DO UPDATE SET
        attempt = excluded.attempt, epoch = excluded.epoch, value = excluded.value, ts = excluded.ts
    """
)


def write_metrics(
    session: Session, job_id: str, attempt: int, rows: Iterable[Mapping[str, Any]]
) -> int:
    """Insert metric rows (``name``, ``step``, ``value``, optional ``epoch``, ``ts``); a row for
    an existing (job, name, step) replaces it, so a resumed attempt that re-logs a step shows
    it once, with the newest value. One statement per batch (plus the per-block extremes of
    the steps it touched). NaN is stored as NULL, +-inf as themselves. Returns the number of rows
    written. Raises ValueError for a negative step, an over-long name or a naive ``ts``.
    Does not commit.
    """
    values = _normalise(job_id, attempt, rows)
    if not values:
        return 0
    if session.get_bind().dialect.name == "postgresql":
        document = json.dumps(
            [
                {"name": v["name"], "step": v["step"], "epoch": v["epoch"],
                 "value": _json_number(v["value"]), "ts": v["ts"].isoformat()}
                for v in values
            ]
        )
        session.execute(_PG_UPSERT, {"job_id": job_id, "attempt": attempt, "rows": document})
    else:
        # sqlite3's executemany runs the one prepared statement over all rows in C.
        insert = sqlite.insert(Metric)
        upsert = insert.on_conflict_do_update(
            index_elements=["job_id", "name", "step"],
            set_={c: insert.excluded[c] for c in ("attempt", "epoch", "value", "ts")},
        )
        session.connection().execute(upsert, values)
    steps = [v["step"] for v in values]
    refresh_blocks(session, job_id, {v["name"] for v in values}, min(steps), max(steps))
    return len(values)


def _normalise(
    job_id: str, attempt: int, rows: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    now = utcnow()
    # Last write wins inside a batch as well: ON CONFLICT cannot touch one row twice.
    unique: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        name, step, epoch = str(row["name"]), int(row["step"]), row.get("epoch")
        if step < 0:
            raise ValueError(f"metric step must be >= 0, got {step} for {name!r}")
        if not 0 < len(name) <= MAX_NAME_LENGTH:
            raise ValueError(
                f"metric name {name[:120]!r} must have 1 to {MAX_NAME_LENGTH} characters"
            )
        unique[(name, step)] = {
            "job_id": job_id,
            "name": name,
            "step": step,
            "attempt": attempt,
            "epoch": int(epoch) if epoch is not None else None,
            "value": _storable(row.get("value")),
            "ts": _aware(row.get("ts")) or now,
        }
    return list(unique.values())


def delete_metrics_after(session: Session, job_id: str, step: int | None) -> int:
    """Delete the job's metrics with ``step > step`` (all of them for None): a resumed attempt
    supersedes what its predecessor logged after the checkpoint it resumes from.
    Returns the number deleted. Does not commit."""
    query = delete(Metric).where(Metric.job_id == job_id)
    if step is not None:
        query = query.where(Metric.step > step)
    deleted = int(session.execute(query).rowcount)  # type: ignore[attr-defined]
    delete_blocks_after(session, job_id, step, metric_names(session, job_id))
    return deleted


def read_metrics(
    session: Session,
    job_id: str,
    name: str | None = None,
    since_step: int | None = None,
    limit: int = 1000,
    cursor: str | None = None,
    until_step: int | None = None,
) -> tuple[list[Point], str | None]:
    """One page of points ordered by (name, step), with ``step > since_step`` and
    ``step <= until_step`` when given.

    Keyset pagination on the primary key: ``next_cursor`` is None on the last page.
    Raises ValueError for limit < 1 and InvalidCursor for a bad cursor."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    query = _page_query(session, job_id, name, since_step, cursor)
    if until_step is not None:
        query = query.where(Metric.step <= until_step)
    query = query.limit(limit + 1)
    rows = list(session.execute(query))
    if len(rows) > limit:
        last = rows[limit - 1]
        return rows[:limit], encode_cursor(last.name, last.step)
    return rows, None


def _page_query(
    session: Session, job_id: str, name: str | None, since_step: int | None, cursor: str | None
) -> PointQuery:
    """The points of a page and all after it, in (name, step) order."""
    query = select(*POINT).where(Metric.job_id == job_id).order_by(Metric.name, Metric.step)
    after = decode_cursor(cursor, (str, int)) if cursor is not None else None
    if name is not None:
        query = query.where(Metric.name == name)
        if after is not None:
            query = query.where(Metric.name == after[0], Metric.step > after[1])
    elif since_step is not None:
        # Every name after a step (what a dashboard polls): without the names, `step >
        # since_step` cannot bound the primary key (job_id, name, step), and PostgreSQL read
        # the job's whole history for each poll (53 ms at 50,000 steps of 7 metrics, vs 0.7 ms
        # with ``name IN (...)``: one seek per name).
        names = metric_names(session, job_id)
        if after is not None:
            return query.where(_after_cursor_by_name(names, since_step, *after))
        query = query.where(Metric.name.in_(names))
    elif after is not None:
        query = query.where(tuple_(Metric.name, Metric.step) > tuple_(*after))
    if since_step is not None:
        query = query.where(Metric.step > since_step)
    return query


def _after_cursor_by_name(
    names: Collection[str], since_step: int, after_name: str, after_step: int
) -> ColumnElement[bool]:
    """Rows after a cursor as short primary-key ranges: the rest of the cursor's metric, then
    the later metrics from ``since_step``. The row comparison ``(name, step) > cursor`` made
    PostgreSQL walk every later metric's whole history and filter it by step (the cost grew
    with the job's length: bench/service/load.py's second pages). "Later" is decided by the database
    (``name > after_name``), so the order is its collation's, as in ORDER BY."""
    later = and_(Metric.name.in_(names), Metric.name > after_name, Metric.step > since_step)
    if after_name not in names:  # a cursor naming no metric of this job: only later ones
        return later
    start = max(after_step, since_step)
    return or_(and_(Metric.name == after_name, Metric.step > start), later)


def read_new_points(
    session: Session, job_id: str, frontiers: Mapping[str, int | None], limit: int
) -> list[Point]:
    """Points of the named metrics past each one's frontier (``step > frontiers[name]``; all
    of them for None), ordered by (name, step), at most ``limit``: what a live stream sends
    next.

    One statement for every name (an OR of primary-key ranges) instead of one per name: a
    stream polls twice a second, and a hundred watchers made the per-name reads most of the
    API's work (bench/service/load.py). When ``limit`` cuts the page, the names after the cut simply
    come in the next poll (each name's frontier moves only with its own rows).
    """
    if not frontiers:
        return []
    ranges = [
        Metric.name == name if step is None else and_(Metric.name == name, Metric.step > step)
        for name, step in sorted(frontiers.items())
    ]
    query = (
        select(*POINT)
        .where(Metric.job_id == job_id, or_(*ranges))
        .order_by(Metric.name, Metric.step)
        .limit(limit)
    )
    return list(session.execute(query))


# A loose index scan: each step finds the next name with one probe of the primary key, so a
# job with 300,000 rows and 5 names costs 6 index probes instead of reading every row.
_NAMES = text(
    """
    WITH RECURSIVE names(name) AS (
        SELECT min(name) FROM metrics WHERE job_id = :job_id
        UNION ALL
        SELECT (SELECT min(m.name) FROM metrics m WHERE m.job_id = :job_id AND m.name > names.name)
        FROM names WHERE names.name IS NOT NULL
    )
    SELECT name,
           (SELECT max(m.step) FROM metrics m WHERE m.job_id = :job_id AND m.name = names.name)
    FROM names WHERE name IS NOT NULL ORDER BY name
    """
)


def metric_names(session: Session, job_id: str) -> list[str]:
    """The distinct metric names a job has written, sorted."""
    return list(latest_steps(session, job_id))


def latest_steps(session: Session, job_id: str) -> dict[str, int]:
    """The highest step written so far for each of the job's metrics (name -> step), by name.

    Used by the API's live stream, which starts each metric at its present frontier."""
    return {name: int(step) for name, step in session.execute(_NAMES, {"job_id": job_id})}


__all__ = [
    "POINT",
    "delete_metrics_after",
    "latest_steps",
    "metric_names",
    "metric_rows",
    "read_metrics",
    "read_new_points",
    "write_metrics",
]
