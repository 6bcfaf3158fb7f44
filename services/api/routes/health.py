"""Liveness and readiness: `/healthz` (the process answers), `/readyz` (database and broker)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, status

from services.api.errors import Problem, problem_responses
from services.api.readiness import ping_broker, ping_database, probe

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers (it checks nothing else)."""
    return {"status": "ok"}


@router.get("/readyz", responses=problem_responses((503, "The database or the broker is down")))
async def readyz(request: Request) -> dict[str, Any]:
    """Ready: the database and the broker both answer within a short deadline."""
    state = request.app.state
    database, broker = await asyncio.gather(
        probe(lambda: ping_database(state.engine)),
        probe(lambda: ping_broker(state.settings.broker_url)),
    )
    down = {name: reason for name, reason in (("database", database), ("broker", broker)) if reason}
    if down:
        raise Problem(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "Not Ready",
            "; ".join(f"{name} unreachable ({reason})" for name, reason in down.items()),
            down=down,
        )
    return {"status": "ready", "database": "ok", "broker": "ok"}
