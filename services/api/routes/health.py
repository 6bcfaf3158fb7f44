"""Liveness and readiness: `/healthz` (the process answers), `/readyz` (database, broker and
the artifact store: a write-read-delete probe, cached for ACCUM_STORE_PROBE_TTL_S)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, status

from services.api.errors import Problem, problem_responses
from services.api.readiness import ping_broker, ping_database, probe

router = APIRouter(tags=["health"])

# A write-read-delete on S3 is three round trips; a slow store is still a working one.
STORE_PROBE_TIMEOUT_S = 5.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers (it checks nothing else)."""
    return {"status": "ok"}


@router.get("/readyz",
            responses=problem_responses((503, "The database, the broker or the artifact store is down")))
async def readyz(request: Request) -> dict[str, Any]:
    """Ready: the database, the broker and the artifact store answer within a short deadline."""
    state = request.app.state
    database, broker, artifacts = await asyncio.gather(
        probe(lambda: ping_database(state.engine)),
        probe(lambda: ping_broker(state.settings.broker_url)),
        probe(lambda: _raise_if(state.store_probe()), timeout_s=STORE_PROBE_TIMEOUT_S),
    )
    checks = (("database", database), ("broker", broker), ("artifacts", artifacts))
    down = {name: reason for name, reason in checks if reason}
    if down:
        raise Problem(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "Not Ready",
            "; ".join(f"{name} unreachable ({reason})" for name, reason in down.items()),
            down=down,
        )
    return {"status": "ready", "database": "ok", "broker": "ok", "artifacts": "ok"}


def _raise_if(reason: str | None) -> None:
    if reason is not None:
        raise RuntimeError(reason)
