"""The dashboard's files over HTTP, without a browser: `/` and every asset answer without a
token, with a content type the browser accepts (module scripts need a JavaScript type) and
cache headers; and no file the browser loads points outside the server (works offline)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from services.api.main import create_app
from services.api.routes.dashboard import STATIC_DIR
from services.settings import Settings

CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
LOADED = tuple(CONTENT_TYPES)  # what the browser fetches; README and LICENSE are for people
# "https://x", "//cdn...", in an attribute, url(), import or string: anything that leaves the origin.
EXTERNAL = re.compile(r"""(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}""", re.IGNORECASE)
LICENSE_BANNER = re.compile(r"/\*!.*?\*/", re.DOTALL)  # "/*! https://github.com/... (v1.6.32) */"
# An XML namespace is a name, never fetched: createElementNS needs SVG's (js/parallel.js).
SVG_NAMESPACE = '"http://www.w3.org/2000/svg"'


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    # No lifespan: the page needs neither the database nor the reaper.
    yield TestClient(create_app(Settings(home=tmp_path), run_reaper=False))


def assets() -> list[Path]:
    return sorted(p for p in STATIC_DIR.rglob("*") if p.suffix in LOADED)


# Swagger UI's and ReDoc's bundles (vendored for /docs and /redoc) carry URLs as text: links in
# their own help, spec examples, SVG namespaces. What matters is that the pages load nothing
# from outside, which tests/api/routes/test_api_docs.py checks on the served pages.
API_DOCS_BUNDLES = STATIC_DIR / "vendor" / "api-docs"


def dashboard_assets() -> list[Path]:
    return [p for p in assets() if API_DOCS_BUNDLES not in p.parents]


def test_the_page_is_served_at_the_root_without_a_token(client: TestClient) -> None:
    response = client.get("/")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["cache-control"] == "no-cache"
    assert "default-src 'self'" in response.headers["content-security-policy"]
    # Every file the page names is served.
    for ref in re.findall(r'(?:src|href)="(dashboard/[^"]+)"', response.text):
        assert client.get(f"/{ref}").status_code == 200, ref


@pytest.mark.parametrize("path", assets(), ids=lambda p: str(p.relative_to(STATIC_DIR)))
def test_each_asset_is_served_with_its_content_type_and_no_token(
    client: TestClient, path: Path
) -> None:
    relative = path.relative_to(STATIC_DIR).as_posix()

    response = client.get(f"/dashboard/{relative}")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith(CONTENT_TYPES[path.suffix])
    assert response.content == path.read_bytes()
    vendored = relative.startswith("vendor/")
    assert ("max-age" in response.headers["cache-control"]) is vendored
    # Revalidation is a cheap 304.
    etag = response.headers["etag"]
    assert client.get(f"/dashboard/{relative}", headers={"If-None-Match": etag}).status_code == 304


@pytest.mark.parametrize("path", dashboard_assets(), ids=lambda p: str(p.relative_to(STATIC_DIR)))
def test_no_asset_references_an_external_url(path: Path) -> None:
    text = LICENSE_BANNER.sub("", path.read_text()).replace(SVG_NAMESPACE, "")

    assert EXTERNAL.findall(text) == []


def test_the_scripts_import_only_files_that_exist() -> None:
    for script in STATIC_DIR.rglob("*.js"):
        for target in re.findall(r'^import .* from "(\.[^"]+)";$', script.read_text(), re.MULTILINE):
            assert (script.parent / target).resolve().is_file(), f"{script.name} imports {target}"


def test_files_outside_the_dashboard_are_not_served(client: TestClient) -> None:
    assert client.get("/dashboard/../main.py").status_code == 404
    assert client.get("/dashboard/%2e%2e/routes/dashboard.py").status_code == 404
