"""The job store shared by the API and the worker: models, engine/session, query functions.

Usage::

    from services.settings import get_settings
    from services.store import jobs, make_engine, make_session_factory

    Session = make_session_factory(make_engine(get_settings()))
    with Session.begin() as session:       # the caller owns the transaction
        job, created = jobs.create_job(session, owner=owner, spec=spec)

One module per table: ``tokens`` (owners, API tokens), ``jobs`` (API-side job lifecycle),
``leases`` (worker-side claim/renew/progress/finish/reap), ``events``, ``metrics`` (with
``metric_blocks``, their per-block extremes, and ``downsample``, which reads them),
``checkpoints``. None of them commits. ``migrate.upgrade(url)`` creates the schema.
"""

from services.store import checkpoints, downsample, events, jobs, leases, metrics, tokens
from services.store.db import make_engine, make_session_factory
from services.store.errors import IdempotencyConflict, InvalidCursor, JobStateError, StoreError
from services.store.models import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    JOB_STATUSES,
    ApiToken,
    Base,
    Checkpoint,
    Job,
    JobEvent,
    Metric,
    MetricBlock,
    Owner,
)
from services.store.types import new_id, utcnow

__all__ = [
    "ACTIVE_STATUSES",
    "FINISHED_STATUSES",
    "JOB_STATUSES",
    "ApiToken",
    "Base",
    "Checkpoint",
    "IdempotencyConflict",
    "InvalidCursor",
    "Job",
    "JobEvent",
    "JobStateError",
    "Metric",
    "MetricBlock",
    "Owner",
    "StoreError",
    "checkpoints",
    "downsample",
    "events",
    "jobs",
    "leases",
    "make_engine",
    "make_session_factory",
    "metrics",
    "new_id",
    "tokens",
    "utcnow",
]
