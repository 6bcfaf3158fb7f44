"""The accum API process: ``create_app(settings)`` builds the FastAPI app.

    uvicorn services.api.main:app                        # settings from ACCUM_* variables
    uvicorn --factory services.api.main:create_app       # the same, built by the factory

The process never imports torch (a test checks): specs are validated with the torch-free
catalog, and training happens in the workers.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from services.api.auth_failures import AuthFailureLimiter, shared_failure_log
from services.api.body_limit import BodySizeLimitMiddleware
from services.api.control_text import refuse_control_characters
from services.api.errors import install_error_handlers
from services.api.routes import (
    api_docs,
    catalog,
    checkpoints,
    dashboard,
    events,
    health,
    job_metrics,
    jobs,
    logs,
    me,
    monitoring,
    tokens,
    workers,
)
from services.api.streams import StreamSlots
from services.api.telemetry import LatencyMiddleware, Telemetry
from services.artifacts import open_store
from services.artifacts.probe import CachedProbe
from services.fleet import FleetView
from services.housekeeping.reaper import LeaseReaper
from services.jobdb.db import make_engine, make_session_factory
from services.settings import Settings, get_settings, trusted_hosts

ROUTERS = (
    jobs.router,
    job_metrics.router,
    events.router,
    logs.router,
    checkpoints.router,
    catalog.router,
    health.router,
    monitoring.router,
    me.router,
    tokens.router,
    workers.router,
    dashboard.router,
    api_docs.router,
)


# Threads that run the sync routes (anyio's default is 40). Routes hold the GIL for most of
# their time and wait on the database only briefly, so more threads mostly fight over the
# GIL: with 32 clients submitting jobs (bench/service/api.py), 8 threads gave ~20% more requests/s,
# less CPU per request and a lower p99 than 40, 16 or 12; 4 was slower again.
ROUTE_THREADS = 8
# Requests that may hold a database session at once (services/api/deps.py, get_session): one
# per route thread. It must stay below the pool's connections (24 on SQLite, 40 on PostgreSQL)
# with room for the event streams' polls, and within the connections the pool keeps open (10):
# a connection past those is closed when returned, so bursts would open new server processes.
SESSION_SLOTS = ROUTE_THREADS


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Size the route thread pool, start the lease reaper (jobs of dead workers are
    re-queued while any accum process runs); stop it and close the database pool on shutdown."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = ROUTE_THREADS
    # Move everything imported and built so far (~100k objects: FastAPI, pydantic, SQLAlchemy,
    # Celery) out of the garbage collector's reach: a full collection over them took ~60 ms
    # and landed on whichever requests were in flight, the bulk of POST /v1/jobs' p99.
    gc.collect()
    gc.freeze()
    reaper = LeaseReaper(app.state.settings).start() if app.state.run_reaper else None
    try:
        yield
    finally:
        if reaper is not None:
            reaper.stop()
        app.state.engine.dispose()


def create_app(settings: Settings | None = None, *, run_reaper: bool = True) -> FastAPI:
    """The API app over the store that `settings` names (default: from ACCUM_* variables)."""
    settings = settings or get_settings()
    app = FastAPI(
        title="accum",
        summary="Training jobs with exact gradient accumulation",
        version="0.1.0",
        lifespan=lifespan,
        # /docs and /redoc come from files installed with the package (routes/api_docs.py):
        # FastAPI's own load them from a CDN.
        docs_url=None,
        redoc_url=None,
        # No control character in any string of a JSON body (they reach people's terminals).
        dependencies=[Depends(refuse_control_characters)],
    )
    app.state.settings = settings
    app.state.run_reaper = run_reaper
    # No pre-ping: every /v1 request's first statement is its token lookup, which replaces a
    # connection the database dropped and tries again (services/api/auth.py), for one round
    # trip less per request.
    app.state.engine = make_engine(settings, pre_ping=False)
    app.state.session_factory = make_session_factory(app.state.engine)
    app.state.session_slots = anyio.Semaphore(SESSION_SLOTS)
    limit, window_s = settings.auth_failures_per_window, settings.auth_failure_window_s
    app.state.auth_failures = AuthFailureLimiter(
        limit, window_s, shared=shared_failure_log(app.state.session_factory, limit, window_s)
    )
    app.state.stream_slots = StreamSlots(settings.max_streams_per_owner)
    app.state.artifacts = open_store(settings.artifacts_url)
    app.state.store_probe = CachedProbe(app.state.artifacts, settings.store_probe_ttl_s)
    app.state.telemetry = telemetry = Telemetry()
    app.state.fleet = FleetView()  # the registry's offers for the submit checks, kept 2 s

    install_error_handlers(app)
    # request.client is the client behind the proxies in ACCUM_FORWARDED_ALLOW_IPS (empty by
    # default: the socket's peer): X-Forwarded-For is believed only from a trusted peer and read
    # from the right, skipping trusted hops, so a client cannot pick its address by sending the
    # header itself. uvicorn's own launch flag is off (services/cli/server.py): this is the one
    # place that reads the header.
    app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=trusted_hosts(settings.forwarded_allow_ips))
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    # Added last, so outermost: it times everything, 413s and error answers included.
    app.add_middleware(LatencyMiddleware, observe=telemetry.observe_request)
    for router in ROUTERS:
        app.include_router(router)
    dashboard.mount_assets(app)
    return app


_app: FastAPI | None = None


def __getattr__(name: str) -> Any:
    """`services.api.main.app`, built on first use (so importing this module reads no env)."""
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _app is None:
        _app = create_app()
    return _app
