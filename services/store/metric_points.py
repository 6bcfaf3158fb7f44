"""Metric pages as plain rows for the API (added by the API part).

``read_metric_points`` is ``metrics.read_metrics`` with the same filters, order and cursors,
returning rows (``name``, ``step``, ``epoch``, ``value``, ``ts``) instead of ORM objects: about
3x cheaper for a 1000-point page, which is what a dashboard polls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from services.store.metrics import names_to_seek, page_query, split_page
from services.store.models import Metric


def read_metric_points(
    session: Session,
    job_id: str,
    name: str | None = None,
    since_step: int | None = None,
    limit: int = 1000,
    cursor: str | None = None,
) -> tuple[list[Any], str | None]:
    """One page ordered by (name, step), ``step > since_step`` when given; ``next_cursor`` is
    None on the last page. Raises ValueError for limit < 1, InvalidCursor for a bad cursor."""
    columns = select(Metric.name, Metric.step, Metric.epoch, Metric.value, Metric.ts)
    names = names_to_seek(session, job_id, name, since_step)
    query = page_query(columns, job_id, name, since_step, limit, cursor, names)
    return split_page(list(session.execute(query)), limit)


def read_new_points(
    session: Session, job_id: str, frontiers: Mapping[str, int | None], limit: int
) -> list[Any]:
    """Rows of the named metrics past each one's frontier (``step > frontiers[name]``; all of
    them for None), ordered by (name, step), at most ``limit``: what a live stream sends next.

    One statement for every name (an OR of primary-key ranges) instead of one per name: a
    stream polls twice a second, and a hundred watchers made the per-name reads most of the
    API's work (bench/load.py). When ``limit`` cuts the page, the names after the cut simply
    come in the next poll (each name's frontier moves only with its own rows).
    """
    if not frontiers:
        return []
    ranges = [
        Metric.name == name if step is None else and_(Metric.name == name, Metric.step > step)
        for name, step in sorted(frontiers.items())
    ]
    query = (
        select(Metric.name, Metric.step, Metric.epoch, Metric.value, Metric.ts)
        .where(Metric.job_id == job_id, or_(*ranges))
        .order_by(Metric.name, Metric.step)
        .limit(limit)
    )
    return list(session.execute(query))
