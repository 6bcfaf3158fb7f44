"""Liveness and readiness: `/healthz` (the process answers), `/readyz` (database, broker and
the artifact store: a write-read-delete probe in the background, at most once per
ACCUM_STORE_PROBE_TTL_S; ok/failing per dependency for anyone, the reasons for admins)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status

from services.api.auth import get_current_owner
from services.api.errors import Problem, problem_responses
from services.api.readiness import PROBE_TIMEOUT_S, ping_broker, ping_database, probe

router = APIRouter(tags=["health"])

@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers (it checks nothing else)."""
    return {"status": "ok"}


@router.get("/readyz",
            responses=problem_responses((503, "The database, the broker or the artifact store is down")))
async def readyz(request: Request) -> dict[str, Any]:
    """Ready: the database, the broker and the artifact store answer, each within a short
    deadline (the store's probe runs in the background: services.artifacts.probe). Anyone is
    told ok or failing per dependency; why (hosts, ports, buckets) only with an admin's token."""
    state = request.app.state
    database, broker, artifacts = await asyncio.gather(
        probe(lambda: ping_database(state.engine)),
        probe(lambda: ping_broker(state.settings.broker_url)),
        probe(lambda: _raise_if(state.store_probe())),
    )
    checks = {"database": database, "broker": broker, "artifacts": artifacts}
    states = {name: "failing" if reason else "ok" for name, reason in checks.items()}
    if not any(checks.values()):
        return {"status": "ready", **states}
    down = {name: reason for name, reason in checks.items() if reason}
    if await _asked_by_admin(request):
        detail = "; ".join(f"{name} unreachable ({reason})" for name, reason in down.items())
    else:
        detail = f"{', '.join(down)} failing; an admin's token on this request shows why"
        down = dict.fromkeys(down, "failing")
    raise Problem(status.HTTP_503_SERVICE_UNAVAILABLE, "Not Ready", detail, down=down,
                  database=states["database"], broker=states["broker"], artifacts=states["artifacts"])


async def _asked_by_admin(request: Request) -> bool:
    """Whether the request carries an admin's token (a bad token is 401, as on every route);
    False while the database cannot tell."""
    if "authorization" not in request.headers:
        return False

    def check() -> bool:
        with request.app.state.session_factory() as session:
            return get_current_owner(request, session, None).is_admin

    try:
        return await asyncio.wait_for(asyncio.to_thread(check), PROBE_TIMEOUT_S)
    except HTTPException:
        raise
    except Exception:  # the database is down or slow: nobody can be told apart
        return False


def _raise_if(reason: str | None) -> None:
    if reason is not None:
        raise RuntimeError(reason)
