"""BodySizeLimitMiddleware: 413 problem+json over the limit, declared or streamed (chunked)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from services.api.body_limit import MAX_BODY_BYTES, BodySizeLimitMiddleware
from services.api.errors import PROBLEM_JSON, install_error_handlers


def make_app(limit: int = MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=limit)

    @app.post("/json")
    def take_json(body: dict[str, Any]) -> dict[str, int]:
        return {"keys": len(body)}

    @app.post("/raw")
    async def take_raw(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    return app


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(make_app(), raise_server_exceptions=False)


def chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        sent += n
        yield b"x" * n


def assert_413(response: Any) -> None:
    assert response.status_code == 413, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body = response.json()
    assert body["status"] == 413 and body["max_body_bytes"] == MAX_BODY_BYTES
    assert str(MAX_BODY_BYTES) in body["detail"]


def test_the_default_limit_is_one_mebibyte() -> None:
    assert MAX_BODY_BYTES == 1024 * 1024


def test_body_at_the_limit_is_accepted(client: TestClient) -> None:
    assert client.post("/raw", content=b"x" * MAX_BODY_BYTES).json() == {"bytes": MAX_BODY_BYTES}


def test_declared_length_over_the_limit_is_413(client: TestClient) -> None:
    assert_413(client.post("/raw", content=b"x" * (MAX_BODY_BYTES + 1)))


def test_json_body_over_the_limit_is_413_not_400_or_422(client: TestClient) -> None:
    big = {"k": "v" * MAX_BODY_BYTES}
    assert_413(client.post("/json", json=big))


@pytest.mark.parametrize("path", ["/raw", "/json"])
def test_chunked_body_without_content_length_is_counted(client: TestClient, path: str) -> None:
    response = client.post(
        path, content=chunks(MAX_BODY_BYTES + 1), headers={"content-type": "application/json"}
    )
    assert_413(response)


def test_small_chunked_body_passes(client: TestClient) -> None:
    assert client.post("/raw", content=chunks(1000, 100)).json() == {"bytes": 1000}


def test_requests_without_body_are_untouched(client: TestClient) -> None:
    assert client.get("/ping").json() == "pong"


def test_body_longer_than_its_content_length_claims_is_counted() -> None:
    """A lying Content-Length must not let a larger streamed body through."""
    limit = 100
    sent: list[dict[str, Any]] = []
    app = make_app(limit)
    messages = [
        {"type": "http.request", "body": b"y" * 60, "more_body": True},
        {"type": "http.request", "body": b"y" * 60},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "path": "/raw",
        "raw_path": b"/raw",
        "root_path": "",
        "scheme": "http",
        "query_string": b"",
        "headers": [(b"content-length", b"10"), (b"host", b"test")],
        "client": ("t", 1),
        "server": ("t", 80),
    }
    asyncio.run(app(scope, receive, send))
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [413]


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        BodySizeLimitMiddleware(make_app(), max_body_bytes=0)
