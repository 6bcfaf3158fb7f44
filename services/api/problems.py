"""RFC 9457 problem details (`application/problem+json`) for every error the API answers.

    from services.api.problems import Problem, install_problem_handlers
    install_problem_handlers(app)          # in create_app
    raise Problem(409, "Conflict", "job abc is already finished")

- request validation -> 422 with `errors: [{"loc": "body.optimizer.lr", "msg", "type",
  "allowed"?}]` (`allowed` where the field has a closed set of values) and a `detail`
  summarising them; malformed JSON -> 400;
- `HTTPException` (404, 401 with `WWW-Authenticate: Bearer`, 405, 409, ...) -> problem+json;
- anything unexpected -> 500 problem+json with an `error_id` that is also logged, so a user
  can quote it and an operator can find the traceback. Bad input never reaches that path.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
ABOUT_BLANK = "about:blank"
# How many field errors the one-line `detail` quotes; `errors` always has them all.
DETAIL_ERRORS = 3


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


def invalid_body(exc: ValidationError) -> Problem:
    """422 for a `ValidationError` raised by validating a request body by hand (`parse_spec`)."""
    return validation_problem(exc.errors(include_url=False), ("body",))


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


async def _on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return exc.response()


async def _on_request_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    problem = _malformed_json(errors) or validation_problem(errors)
    return problem.response()


async def http_problem_response(request: Request, exc: Exception) -> JSONResponse:
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


# May answer a request instead of its 422 (a bad token's 401: services/api/owner_route.py).
BeforeValidationError = Callable[[Request], Awaitable[JSONResponse | None]]


def install_problem_handlers(
    app: FastAPI, *, before_validation_error: BeforeValidationError | None = None
) -> None:
    """Make every error answer of `app` an RFC 9457 problem+json body."""

    async def on_request_validation(request: Request, exc: Exception) -> JSONResponse:
        answer = await before_validation_error(request) if before_validation_error else None
        if answer is not None:
            return answer
        return await _on_request_validation(request, exc)

    app.add_exception_handler(Problem, _on_problem)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(StarletteHTTPException, http_problem_response)
    # Starlette calls the Exception handler from its outermost middleware and then re-raises
    # the exception so the server logs it; the client still gets this body.
    app.add_exception_handler(Exception, _on_unexpected)
