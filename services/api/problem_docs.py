"""The error answers of the API as OpenAPI documents them: RFC 9457 problem+json, one schema.

    from services.api.problem_docs import problem_responses
    router = APIRouter(prefix="/v1/jobs", responses=problem_responses(401, 422, 429, 503))
    @router.get("/{job_id}", responses=problem_responses((404, "No such job (or not yours)")))

    install_problem_docs(app)   # in create_app: puts the Problem schema into components

Each status gets a default description below (a route may give its own with `(status,
description)`), the `application/problem+json` content with the `Problem` schema, and the
headers that come with it (`WWW-Authenticate` on 401, `Retry-After` on 429 and 503).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from services.api.problems import PROBLEM_JSON

REF = "#/components/schemas/{model}"


class FieldError(BaseModel):
    """One invalid field of a 422."""

    loc: str = Field(description="Dotted path of the field, e.g. `body.optimizer.lr`")
    msg: str = Field(description="What is wrong and how to fix it")
    type: str
    allowed: list[Any] | None = Field(None, description="The allowed values, for closed sets")


class Problem(BaseModel):
    """An error answer (RFC 9457); extension members such as `errors` may be added."""

    model_config = ConfigDict(extra="allow")

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


def install_problem_docs(app: FastAPI) -> None:
    """Add the `Problem` and `FieldError` schemas to the app's OpenAPI components (the routes
    refer to them by `$ref`; FastAPI only adds the schemas of response models itself)."""
    build = app.openapi
    _, top = models_json_schema(
        [(FieldError, "serialization"), (Problem, "serialization")], ref_template=REF
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()  # caches it in app.openapi_schema
            document.setdefault("components", {}).setdefault("schemas", {}).update(top["$defs"])
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]
