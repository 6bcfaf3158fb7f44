"""Database outages answer 503 problem+json with Retry-After, never a 500 or a hang.

While PostgreSQL restarts, every request that needs it fails fast (the engine's connect
timeout; a pooled connection the restart killed fails the request's first statement, the
token lookup, which renews the pool and tries once more) with a connection error; this turns
those into a 503 that tells the client to come back, and the API recovers on its own once the
database answers.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from services.api.problems import Problem
from services.store.db import database_unreachable, first_line

log = logging.getLogger(__name__)

RETRY_AFTER_S = 2


async def _on_database_error(request: Request, exc: Exception) -> JSONResponse:
    if not database_unreachable(exc):
        raise exc  # a real bug (bad SQL, constraint): the 500 handler logs it with an error id
    return database_unavailable_response(request, exc)


def database_unavailable_response(request: Request, exc: Exception) -> JSONResponse:
    """The 503 for a database that cannot be reached (`database_unreachable(exc)`)."""
    log.warning(
        "database unavailable on %s %s: %s", request.method, request.url.path, first_line(exc)
    )
    return Problem(
        503,
        "Database Unavailable",
        f"the database cannot be reached right now; retry in {RETRY_AFTER_S} s "
        "(GET /readyz says when it is back)",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    ).response()


def install_database_unavailable_handler(app: FastAPI) -> None:
    # DBAPIError covers OperationalError, InterfaceError and a dropped connection surfacing as
    # another subclass (flagged connection_invalidated); handlers are found by the exception's
    # class hierarchy, so DataError keeps its own, more specific handler (400).
    for error in (DBAPIError, PoolTimeout):
        app.add_exception_handler(error, _on_database_error)
