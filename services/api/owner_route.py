"""Routes that look the bearer token up in their own thread, before their code runs.

    router = APIRouter(prefix="/v1/jobs", route_class=OwnerLookupRoute)

    @router.get("/{job_id}")
    def read_job(*, session: SessionDep, owner: CurrentOwner, job_id: str) -> JobPublic: ...

FastAPI runs each plain `def` dependency and the route itself in the thread pool, one hop
each. `CurrentOwner` therefore does no I/O (it checks the header's form and the failure
limit, `services/api/deps.py`) and hands over a `PendingOwner`; this route class wraps the
endpoint so that the token lookup is the first thing done inside the route's own hop, and the
route's code gets the `Owner`. A 401 still comes before any of the route's own work, and
before a 422: parameters that fail validation skip the route, so `token_refusal` looks the
token up before that answer. (A body that is not JSON at all is answered 400 before any
dependency runs, token or not, as it was when the lookup was a dependency.) It saved a thread hop per request: see bench/notes.md (POST
/v1/jobs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from inspect import iscoroutinefunction
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute

from services.api.auth import PendingOwner
from services.api.deps import get_current_owner
from services.api.errors import database_unavailable_response, http_problem_response
from services.store.db import database_unreachable


def resolve_owners(arguments: dict[str, Any]) -> None:
    """Replace every PendingOwner among a route's arguments by its Owner (401 if unknown)."""
    for name, value in arguments.items():
        if isinstance(value, PendingOwner):
            arguments[name] = value.resolve()


def owner_first(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """`endpoint`, resolving its owner first; FastAPI reads the signature through `wraps`."""
    if iscoroutinefunction(endpoint):

        @wraps(endpoint)
        async def run_async(**arguments: Any) -> Any:
            if any(isinstance(value, PendingOwner) for value in arguments.values()):
                await run_in_threadpool(resolve_owners, arguments)
            return await endpoint(**arguments)

        return run_async

    @wraps(endpoint)
    def run(**arguments: Any) -> Any:
        resolve_owners(arguments)
        return endpoint(**arguments)

    return run


class OwnerLookupRoute(APIRoute):
    """An APIRoute whose endpoint gets `CurrentOwner` looked up in its own thread."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, owner_first(endpoint), **kwargs)


def owner_parameters(dependant: Dependant) -> tuple[list[str], list[str]]:
    """Where a route depends on `CurrentOwner`: (endpoint parameters that receive it, other
    places: a nameless ``dependencies=[...]`` entry or a sub-dependency, which would get the
    unresolved PendingOwner, or no lookup at all)."""
    direct: list[str] = []
    elsewhere: list[str] = []
    for sub in dependant.dependencies:
        if sub.call is get_current_owner:
            (direct if sub.name else elsewhere).append(sub.name or "dependencies=[...]")
        elif owner_parameters(sub) != ([], []):
            elsewhere.append(f"inside {getattr(sub.call, '__name__', sub.call)}")
    return direct, elsewhere


def api_routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
    """Every APIRoute under `routes`: FastAPI 0.16x keeps an included router's own routes
    behind an entry with ``original_router``; older versions copied them in."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif (router := getattr(route, "original_router", None)) is not None:
            yield from api_routes(router.routes)


def check_owner_routes(app: FastAPI) -> None:
    """Refuse to build an app where a route's `CurrentOwner` would not be looked up: its
    router lacks ``route_class=OwnerLookupRoute``, or the owner is depended on anywhere but as
    a parameter of the endpoint itself (the only place the route class resolves it)."""
    wrong = []
    for route in api_routes(app.routes):
        direct, elsewhere = owner_parameters(route.dependant)
        where = f"{sorted(route.methods or ())} {route.path}"
        if elsewhere:
            wrong.append(f"{where} ({', '.join(elsewhere)}: take `owner: CurrentOwner` instead)")
        elif direct and not isinstance(route, OwnerLookupRoute):
            wrong.append(f"{where} (give its APIRouter route_class=OwnerLookupRoute)")
    if wrong:
        raise RuntimeError(f"routes whose CurrentOwner would not be looked up: {'; '.join(wrong)}")


async def token_refusal(request: Request) -> JSONResponse | None:
    """For a request about to get 422 before its route ran: the 401 its token earns (or 503
    if the database is down), so a bad token is not answered with a field-by-field 422.
    None when the token is good or was already looked up."""
    pending: PendingOwner | None = getattr(request.state, "pending_owner", None)
    if pending is None or pending.owner is not None:
        return None
    try:
        await run_in_threadpool(pending.resolve_in_new_session, request.app.state.session_factory)
    except HTTPException as exc:
        return await http_problem_response(request, exc)
    except Exception as exc:
        if not database_unreachable(exc):
            raise
        return database_unavailable_response(request, exc)
    return None
