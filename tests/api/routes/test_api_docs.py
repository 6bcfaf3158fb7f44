"""/docs and /redoc work offline: no external URL in either page, and every file they load
is served by the API itself (services/api/routes/api_docs.py)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize(("path", "script"), [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")])
def test_the_api_docs_pages_load_only_files_of_this_server(
    client: TestClient, path: str, script: str
) -> None:
    page = client.get(path)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "http://" not in page.text and "https://" not in page.text and "//cdn" not in page.text
    loaded = re.findall(r'(?:src|href|url|spec-url)\s*[=:]\s*[\'"]([^\'"]+)[\'"]', page.text)
    assert any(url.endswith(script) for url in loaded), loaded
    for url in loaded:
        assert url.startswith("/"), url  # this server, no other host
        served = client.get(url)
        assert served.status_code == 200, url
        assert len(served.content) > 0
    assert "/openapi.json" in loaded


def test_the_oauth2_redirect_page_is_served(client: TestClient) -> None:
    assert client.get("/docs/oauth2-redirect").status_code == 200
