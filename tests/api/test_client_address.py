"""Whose address a request is counted under: the peer, or behind a trusted proxy the first
untrusted hop of X-Forwarded-For read from the right (uvicorn's ProxyHeadersMiddleware, given
ACCUM_FORWARDED_ALLOW_IPS through services.settings.trusted_hosts, as services/api/main.py does)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from services.settings import Settings, trusted_hosts, trusted_proxies


def client_address(peer: str, forwarded: str | None, allow_ips: str) -> str:
    """`request.client.host` as a route sees it, the request from `peer` with that header."""
    headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded is not None else []
    seen: list[str] = []

    async def route(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["client"][0])

    app = ProxyHeadersMiddleware(route, trusted_hosts=trusted_hosts(allow_ips))
    asyncio.run(app({"type": "http", "client": (peer, 5000), "headers": headers}, None, None))  # type: ignore[arg-type]
    return seen[0]


def test_without_trusted_proxies_the_header_is_ignored() -> None:
    assert client_address("203.0.113.7", "1.2.3.4", "") == "203.0.113.7"


def test_only_a_trusted_peer_may_name_the_client() -> None:
    trusted = "192.0.2.5, 198.18.0.0/16"
    assert client_address("192.0.2.5", "198.51.100.2", trusted) == "198.51.100.2"
    assert client_address("198.18.2.3", "198.51.100.2", trusted) == "198.51.100.2"
    # An untrusted peer's header is its own invention.
    assert client_address("198.19.0.1", "198.51.100.2", trusted) == "198.19.0.1"
    assert client_address("192.0.2.5", None, trusted) == "192.0.2.5"


def test_a_client_cannot_pick_its_address_by_sending_the_header_itself() -> None:
    # The client sent "X-Forwarded-For: 1.1.1.1"; the proxy appended what it saw.
    spoofed = client_address("192.0.2.5", "1.1.1.1, 198.51.100.2, 192.0.2.6", "192.0.2.5,192.0.2.6")
    assert spoofed == "198.51.100.2"


def test_the_setting_is_checked_at_start_up() -> None:
    assert Settings().forwarded_allow_ips == ""
    assert len(trusted_proxies("*")) == 2
    with pytest.raises(ValidationError, match="not an IP address or network"):
        Settings(forwarded_allow_ips="proxy.local")


def test_a_network_written_with_host_bits_is_trusted_as_the_setting_check_reads_it() -> None:
    # uvicorn alone would take "198.18.2.3/16" as a name and trust nobody for it.
    assert trusted_hosts("198.18.2.3/16, *") == ["198.18.0.0/16", "0.0.0.0/0", "::/0"]
    assert client_address("198.18.9.9", "198.51.100.2", "198.18.2.3/16") == "198.51.100.2"
