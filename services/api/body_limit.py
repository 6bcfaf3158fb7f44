"""Refuse request bodies over a size limit with 413 problem+json (pure ASGI middleware).

    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=settings.max_body_bytes)

A declared `Content-Length` over the limit is refused before the body is read. Chunked
bodies (no `Content-Length`) and bodies longer than declared are counted as they stream in:
once the count passes the limit, reading fails, whatever the app was about to answer is
dropped, and the client gets the 413 instead. Nothing over the limit is ever buffered.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.errors import PROBLEM_JSON

MAX_BODY_BYTES = 1 << 20  # 1 MiB


class BodyTooLarge(Exception):
    """Raised into the app by `receive` when the streamed body passes the limit."""


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server rejects malformed lengths itself
    return None


def _too_large_body(limit: int) -> bytes:
    return json.dumps(
        {
            "type": "about:blank",
            "title": "Content Too Large",
            "status": 413,
            "detail": f"the request body is over the limit of {limit} bytes; send a smaller body",
            "max_body_bytes": limit,
        },
        separators=(",", ":"),
    ).encode()


async def _send_too_large(send: Send, limit: int) -> None:
    body = _too_large_body(limit)
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
                # The rest of the body was not read: the connection cannot be reused.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodySizeLimitMiddleware:
    """413 for HTTP request bodies over `max_body_bytes`, declared or streamed."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            await _send_too_large(send, limit)
            return

        received = 0
        exceeded = False
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise BodyTooLarge(f"request body over {limit} bytes")
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal response_started
            if exceeded and not response_started:
                return  # the app's answer to a truncated body (often a 400): replaced below
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            # Whatever the app made of BodyTooLarge (re-raised, or wrapped in another error).
            if not exceeded:
                raise
        if exceeded and not response_started:
            await _send_too_large(send, limit)
