"""`/docs` (Swagger UI) and `/redoc` from files installed with the package, not from a CDN.

FastAPI's own pages load their JavaScript from cdn.jsdelivr.net (and a favicon and fonts from
other hosts), so on an offline cluster they were blank. The same pages here point at copies
under the dashboard's vendor directory (`static/vendor/api-docs/`, see its README), served by
the API itself.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse

from services.api.routes.dashboard import ASSETS_PATH

ASSETS = f"{ASSETS_PATH}/vendor/api-docs"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"

router = APIRouter(tags=["docs"], include_in_schema=False)


def _root(request: Request) -> str:
    """The path prefix the app is served under (behind a proxy), as FastAPI's pages use it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over this server's OpenAPI document."""
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - Swagger UI",
        oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT}",
        swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
        swagger_ui_parameters=request.app.swagger_ui_parameters,
    )


@router.get(OAUTH2_REDIRECT)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    """ReDoc over this server's OpenAPI document."""
    root = _root(request)
    return get_redoc_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
        with_google_fonts=False,
    )
