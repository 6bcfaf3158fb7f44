"""The web dashboard: `/` is the page (no token: it asks for one), `/dashboard/*` its files.

The files are static (HTML, vanilla JS modules, one CSS file, uPlot vendored): no build step,
nothing fetched from outside, so the page works offline. Every /v1 call the page makes sends
the token the user entered, kept in the browser's local storage.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).resolve().parents[1] / "dashboard" / "static"
ASSETS_PATH = "/dashboard"

# Our own files change with each deploy and are small: the browser revalidates them on every
# load (a 304 by ETag), so a new version shows at once. The vendored library only changes with
# its version (static/vendor/README.md), so a day's caching is safe.
REVALIDATE = "no-cache"
VENDOR_CACHE = "public, max-age=86400"
# The page may load and call only its own origin: a stray CDN link fails in development,
# not on an offline cluster. uPlot sizes its elements with inline styles.
CSP = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)

router = APIRouter(tags=["dashboard"], include_in_schema=False)


class DashboardFiles(StaticFiles):
    """StaticFiles with the cache headers above (ETag and 304s come from StaticFiles)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code in (200, 304):
            vendored = path.replace("\\", "/").startswith("vendor/")
            response.headers["Cache-Control"] = VENDOR_CACHE if vendored else REVALIDATE
        return response


@router.get("/")
async def dashboard_page() -> FileResponse:
    """The dashboard's single page; it routes by URL hash (#/jobs, #/jobs/ID, ...)."""
    return FileResponse(
        STATIC_DIR / "index.html",
        media_type="text/html",
        headers={"Cache-Control": REVALIDATE, "Content-Security-Policy": CSP},
    )


def mount_assets(app: FastAPI) -> None:
    """Serve the dashboard's files under ASSETS_PATH (a mount: StaticFiles is an ASGI app)."""
    app.mount(ASSETS_PATH, DashboardFiles(directory=STATIC_DIR), name="dashboard")
