"""The job database (jobdb; the object store of checkpoints is ``services.artifacts``) shared by the API and the worker: models, engine/session, query functions.

Usage::

    from services.settings import get_settings
    from services.jobdb import jobs
    from services.jobdb.db import make_engine, make_session_factory

    Session = make_session_factory(make_engine(get_settings()))
    with Session.begin() as session:       # the caller owns the transaction
        job, created = jobs.create_job(session, owner=owner, spec=spec)

One module per concern: ``status`` (``JobStatus`` and its sets; imports nothing else),
``models``, ``db`` (engine, sessions), ``tokens`` (owners, API tokens), ``jobs`` (API-side
job lifecycle), ``leases`` (worker-side claim/renew/progress/finish/reap), ``events``,
``metrics`` (with ``metric_blocks``, their per-block extremes, and ``downsample``, which reads
them), ``checkpoints``. None of them commits. ``migrate.upgrade(url)`` creates the schema.

This package imports nothing itself, so ``services.jobdb.status`` costs no SQLAlchemy import
(the CLI reads statuses from JSON); import the module you need.
"""
