"""Whose address a request is counted under: the peer, or behind a trusted proxy the first
untrusted hop of X-Forwarded-For read from the right (services/api/client_address.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from starlette.requests import Request

from services.api.client_address import client_address, trusted_proxies
from services.settings import Settings


def request_from(peer: str, forwarded: str | None = None) -> Request:
    headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded is not None else []
    return Request({"type": "http", "client": (peer, 5000), "headers": headers})


def test_without_trusted_proxies_the_header_is_ignored() -> None:
    assert client_address(request_from("203.0.113.7", "1.2.3.4"), ()) == "203.0.113.7"


def test_only_a_trusted_peer_may_name_the_client() -> None:
    trusted = trusted_proxies("10.0.0.5, 10.1.0.0/16")
    assert client_address(request_from("10.0.0.5", "198.51.100.2"), trusted) == "198.51.100.2"
    assert client_address(request_from("10.1.2.3", "198.51.100.2"), trusted) == "198.51.100.2"
    # An untrusted peer's header is its own invention.
    assert client_address(request_from("10.2.0.1", "198.51.100.2"), trusted) == "10.2.0.1"
    assert client_address(request_from("10.0.0.5"), trusted) == "10.0.0.5"


def test_a_client_cannot_pick_its_address_by_sending_the_header_itself() -> None:
    # The client sent "X-Forwarded-For: 1.1.1.1"; the proxy appended what it saw.
    trusted = trusted_proxies("10.0.0.5,10.0.0.6")
    spoofed = request_from("10.0.0.5", "1.1.1.1, 198.51.100.2, 10.0.0.6")
    assert client_address(spoofed, trusted) == "198.51.100.2"


def test_the_setting_is_checked_at_start_up() -> None:
    assert Settings().forwarded_allow_ips == ""
    assert len(trusted_proxies("*")) == 2
    with pytest.raises(ValidationError, match="not an IP address or network"):
        Settings(forwarded_allow_ips="proxy.local")
