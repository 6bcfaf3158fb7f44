"""RFC 9457 problem details (`application/problem+json`) for every error the API answers.

    from services.api.errors import Problem, invalid_field, problem_responses
    install_error_handlers(app)            # in create_app: the handlers and the OpenAPI schema
    raise Problem(409, "Conflict", "job abc is already finished")
    raise invalid_field(("query", "cursor"), "invalid cursor", cursor)         # a 422
    router = APIRouter(prefix="/v1/jobs", responses=problem_responses(401, 422, 429, 503))

- request validation -> 422 with `errors: [{"loc": "body.optimizer.lr", "msg", "type",
  "allowed"?}]` (`allowed` where the field has a closed set of values) and a `detail`
  summarising them; malformed JSON -> 400;
- `HTTPException` (404, 401 with `WWW-Authenticate: Bearer`, 405, 409, ...) -> problem+json;
- a value the database cannot store or search for (`DataError`, e.g. a NUL byte) -> 400;
- a database that cannot be reached -> 503 with `Retry-After`, never a 500 or a hang;
- anything unexpected -> 500 problem+json with an `error_id` that is also logged, so a user
  can quote it and an operator can find the traceback. Bad input never reaches that path.

OpenAPI declares each error status of a route with `problem_responses`: a default description
(or the route's own, `(status, description)`), the `Problem` schema and the headers that come
with it (`WWW-Authenticate` on 401, `Retry-After` on 429 and 503).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import DataError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.api.field_messages import reword
from services.api.unknown_fields import body_model, explain_unknown_fields
from services.jobdb.db import database_unreachable, first_line
from services.spec.refusal import Refusal

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
ABOUT_BLANK = "about:blank"
# How many field errors the one-line `detail` quotes; `errors` always has them all.
DETAIL_ERRORS = 3
# What a 503 for a database outage tells the client to wait.
RETRY_AFTER_S = 2


class Problem(Exception):
    """An error answer: raise it from a route, the handler renders it as problem+json.

    `extra` members are added to the body (RFC 9457 extension members), e.g. `errors`.
    """

    def __init__(
        self,
        status: int,
        title: str | None = None,
        detail: str | None = None,
        *,
        type: str = ABOUT_BLANK,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        self.status = status
        self.title = title or _phrase(status)
        self.detail = detail
        self.type = type
        self.headers = dict(headers or {})
        self.extra = extra
        super().__init__(f"{status} {self.title}: {detail}" if detail else f"{status} {self.title}")

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": self.type, "title": self.title, "status": self.status}
        if self.detail is not None:
            body["detail"] = self.detail
        body.update(self.extra)
        return body

    def response(self) -> JSONResponse:
        return JSONResponse(
            self.body(), status_code=self.status, headers=self.headers, media_type=PROBLEM_JSON
        )


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


# --- 422: field paths and allowed values ------------------------------------------------------


def dotted(loc: Iterable[Any]) -> str:
    """`("body", "optimizer", "lr")` -> `"body.optimizer.lr"`."""
    return ".".join(str(part) for part in loc)


def _allowed(error: Mapping[str, Any]) -> list[Any] | None:
    ctx = error.get("ctx") or {}
    if isinstance(ctx.get("allowed"), list | tuple):  # our own validators (services.spec)
        return list(ctx["allowed"])
    expected = ctx.get("expected")
    if error.get("type") in ("literal_error", "enum") and isinstance(expected, str):
        # pydantic's Literal/Enum errors give the choices as text: "'a', 'b' or 'c'"
        return re.findall(r"'((?:[^'\\]|\\.)*)'", expected) or None
    return None


def field_errors(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic errors as JSON-safe items: `loc` dotted, `msg`, `type`, `allowed` if any.

    The raw `input` and `ctx` are dropped: they may be large or not JSON-serialisable.
    """
    items = []
    for error in errors:
        item: dict[str, Any] = {
            "loc": dotted(error.get("loc", ())),
            "msg": str(error.get("msg", "")),
            "type": str(error.get("type", "")),
        }
        if (allowed := _allowed(error)) is not None:
            item["allowed"] = allowed
        items.append(item)
    return items


def validation_problem(
    errors: Sequence[Mapping[str, Any]], loc_prefix: Sequence[str] = ()
) -> Problem:
    """422 for a list of pydantic errors; `loc_prefix` (e.g. `("body",)`) is put in front."""
    prefixed = [{**e, "loc": (*loc_prefix, *e.get("loc", ()))} for e in errors]
    items = field_errors(prefixed)
    quoted = "; ".join(
        f"{i['loc']}: {i['msg']}" if i["loc"] else i["msg"] for i in items[:DETAIL_ERRORS]
    )
    more = f" (and {len(items) - DETAIL_ERRORS} more)" if len(items) > DETAIL_ERRORS else ""
    count = f"{len(items)} invalid field{'s' if len(items) != 1 else ''}"
    return Problem(422, "Invalid request", f"{count}: {quoted}{more}", errors=items)


FieldRefusal = tuple[tuple[str | int, ...], str, Any, Sequence[Any] | None]


def invalid_field(
    loc: tuple[str | int, ...], message: str, value: Any, allowed: Sequence[Any] | None = None
) -> RequestValidationError:
    """A 422 about one field a route checks itself: its path, what was wrong and, for closed
    sets, the allowed values (the same shape as FastAPI's own validation errors)."""
    return invalid_fields([(loc, message, value, allowed)])


def invalid_fields(refusals: Iterable[FieldRefusal]) -> RequestValidationError:
    """`invalid_field` for several fields at once: `(loc, message, value, allowed)` each."""
    errors = []
    for loc, message, value, allowed in refusals:
        error: dict[str, Any] = {"type": "value_error", "loc": loc, "msg": message, "input": value}
        if allowed is not None:
            error["type"] = "not_allowed"
            error["ctx"] = {"allowed": list(allowed)}
        errors.append(error)
    return RequestValidationError(errors)


def refused(refusals: Iterable[Refusal]) -> RequestValidationError:
    """The 422 for an admission check's refusals (services/admission), each at `body.<field>`."""
    return RequestValidationError([refusal.as_error() for refusal in refusals])


def _malformed_json(errors: Sequence[Mapping[str, Any]]) -> Problem | None:
    for error in errors:
        if error.get("type") == "json_invalid":
            loc = tuple(error.get("loc", ()))
            where = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            reason = (error.get("ctx") or {}).get("error") or error.get("msg") or "invalid JSON"
            return Problem(
                400, "Malformed JSON", f"the request body is not valid JSON: {reason}{where}"
            )
    return None


# --- the handlers -----------------------------------------------------------------------------


async def _on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return exc.response()


async def _on_request_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    model = body_model(request)
    errors = reword(explain_unknown_fields(exc.errors(), model), model)
    problem = _malformed_json(errors) or validation_problem(errors)
    return problem.response()


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    title = _phrase(exc.status_code)
    detail: str | None = exc.detail if isinstance(exc.detail, str) else None
    extra: dict[str, Any] = {}
    if not isinstance(exc.detail, str) and exc.detail is not None:
        extra["errors"] = exc.detail  # a route may pass structured detail; keep it
    if detail == title:  # Starlette's own 404/405 say only the phrase: say what to do instead
        detail = _routing_hint(request, exc.status_code, headers)
    return Problem(exc.status_code, title, detail, headers=headers, **extra).response()


def _routing_hint(request: Request, status: int, headers: Mapping[str, str]) -> str | None:
    where = f"{request.method} {request.url.path}"
    if status == 404:
        return f"no route for {where}; the API is described at /docs"
    allow = next((v for k, v in headers.items() if k.lower() == "allow"), None)
    if status == 405 and allow:
        return f"{where} is not allowed; methods allowed here: {allow}"
    return None


async def _on_data_error(request: Request, exc: Exception) -> JSONResponse:
    # Only request values reach queries unchecked by type (a NUL byte inside an otherwise
    # valid string is the usual one, which PostgreSQL text cannot hold): the client's error.
    return Problem(
        400,
        "Bad Request",
        "a value in the request cannot be stored or searched for (e.g. it contains a NUL "
        "character or is out of range); remove it and retry",
    ).response()


async def _on_database_error(request: Request, exc: Exception) -> JSONResponse:
    """503 while the database cannot be reached: every request that needs it fails fast (the
    engine's connect timeout; a pooled connection a restart killed fails the request's first
    statement, the token lookup, which renews the pool and tries once more), and the API
    recovers on its own once the database answers."""
    if not database_unreachable(exc):
        raise exc  # a real bug (bad SQL, constraint): the 500 handler logs it with an error id
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


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    error_id = uuid.uuid4().hex
    log.error(
        "unhandled error %s on %s %s", error_id, request.method, request.url.path, exc_info=exc
    )
    return Problem(
        500,
        "Internal Server Error",
        f"the server failed to handle this request; quote error id {error_id} when reporting it",
        error_id=error_id,
        instance=f"urn:uuid:{uuid.UUID(error_id)}",
    ).response()


def install_error_handlers(app: FastAPI) -> None:
    """Make every error answer of `app` an RFC 9457 problem+json body, and put the `Problem`
    schema into its OpenAPI document."""
    app.add_exception_handler(Problem, _on_problem)
    app.add_exception_handler(RequestValidationError, _on_request_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    # Handlers are found by the exception's class hierarchy: DataError (400) is more specific
    # than DBAPIError, which covers OperationalError, InterfaceError and a dropped connection
    # surfacing as another subclass (flagged connection_invalidated).
    app.add_exception_handler(DataError, _on_data_error)
    for error in (DBAPIError, PoolTimeout):
        app.add_exception_handler(error, _on_database_error)
    # Starlette calls the Exception handler from its outermost middleware and then re-raises
    # the exception so the server logs it; the client still gets this body.
    app.add_exception_handler(Exception, _on_unexpected)
    _install_schemas(app)


# --- OpenAPI ----------------------------------------------------------------------------------

REF = "#/components/schemas/{model}"


class FieldError(BaseModel):
    """One invalid field of a 422."""

    loc: str = Field(description="Dotted path of the field, e.g. `body.optimizer.lr`")
    msg: str = Field(description="What is wrong and how to fix it")
    type: str
    allowed: list[Any] | None = Field(None, description="The allowed values, for closed sets")


class ProblemSchema(BaseModel):
    """An error answer (RFC 9457); extension members such as `errors` may be added."""

    # Shown as `Problem` in the document (the name `Problem` is the exception's here).
    model_config = ConfigDict(extra="allow", title="Problem")

    type: str = Field(description="`about:blank`: the status and title say it all")
    title: str
    status: int
    detail: str | None = Field(None, description="What went wrong, and what to do about it")
    errors: list[FieldError] | None = Field(None, description="On 422: every invalid field")


DESCRIPTIONS = {
    400: "Malformed JSON, or a value that cannot be stored or searched for (e.g. a NUL character)",
    401: "Missing, unknown or revoked bearer token (`accum token create NAME` makes one)",
    404: "No such job (or not yours)",
    409: "The request conflicts with the job's current state",
    413: "The request body is larger than ACCUM_MAX_BODY_BYTES",
    422: "Invalid request: `errors` names each field (`loc`), what is wrong, the allowed values",
    429: "Too many requests (e.g. failed token checks from this address): retry after Retry-After",
    503: "The database cannot be reached right now: retry after Retry-After",
}
_RETRY_AFTER = {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}
HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}},
    429: {"Retry-After": _RETRY_AFTER},
    503: {"Retry-After": _RETRY_AFTER},
}


def problem_responses(*statuses: int | tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for these error statuses, each `status` or `(status, description)`."""
    responses: dict[int | str, dict[str, Any]] = {}
    for item in statuses:
        status, description = item if isinstance(item, tuple) else (item, DESCRIPTIONS[item])
        response: dict[str, Any] = {
            "description": description,
            "content": {PROBLEM_JSON: {"schema": {"$ref": REF.format(model="Problem")}}},
        }
        if status in HEADERS:
            response["headers"] = HEADERS[status]
        responses[status] = response
    return responses


def _install_schemas(app: FastAPI) -> None:
    """Add the `Problem` and `FieldError` schemas to the app's OpenAPI components (the routes
    refer to them by `$ref`; FastAPI only adds the schemas of response models itself)."""
    build = app.openapi
    problem = ProblemSchema.model_json_schema(ref_template=REF, mode="serialization")
    components = {**problem.pop("$defs"), "Problem": problem}

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()  # caches it in app.openapi_schema
            document.setdefault("components", {}).setdefault("schemas", {}).update(components)
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]
