"""The worker registry: `GET /v1/workers` lists the workers that registered themselves.

Owners see what they need to pick a queue (name, queues, devices, state); admins see every
field (host, pid, versions, what each can build, its current job, heartbeat age).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.api.auth import CurrentOwner
from services.api.deps import SessionDep, SettingsDep
from services.api.errors import problem_responses
from services.api.schemas import WorkerList, WorkerPublic
from services.jobdb import workers as store_workers

router = APIRouter(prefix="/v1/workers", tags=["workers"], responses=problem_responses(401, 429, 503))


@router.get("", response_model=WorkerList, response_model_exclude_unset=True)
def list_workers(*, session: SessionDep, owner: CurrentOwner, settings: SettingsDep) -> WorkerList:
    """Registered workers by name: busy, idle, lost (silent for the lease timeout) or stopped."""
    views = store_workers.list_workers(session, settings.lease_timeout_s)
    items = []
    for view in views:
        fields: dict[str, Any] = {
            "name": view.row.name, "queues": view.row.queues, "devices": view.row.devices,
            "state": view.state,
        }
        if owner.is_admin:
            row = view.row
            fields |= {
                "host": row.host, "pid": row.pid, "gpus": row.gpus, "models": row.models,
                "datasets": row.datasets, "plugins": row.plugins, "versions": row.versions,
                "accum_version": row.accum_version, "started_at": row.started_at,
                "last_seen": row.last_seen, "stopped_at": row.stopped_at,
                "current_job": view.current_job, "heartbeat_age_s": round(view.heartbeat_age_s, 3),
            }
        items.append(WorkerPublic(**fields))
    return WorkerList(items=items)
