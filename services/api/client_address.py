"""The client's address, through the reverse proxies this service trusts and no others.

    trusted = trusted_proxies(settings.forwarded_allow_ips)   # "10.0.0.5, 10.1.0.0/16"
    address = client_address(request, trusted)

`X-Forwarded-For` is believed only when the connection comes from a trusted proxy
(`ACCUM_FORWARDED_ALLOW_IPS`, empty by default: the socket's peer is the client). The header is
read from the right, skipping trusted hops, so a client cannot pick its address by sending the
header itself: the first untrusted hop is the one a trusted proxy saw. The API's own launcher
runs uvicorn without its proxy-header handling, so this is the only place that reads it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from starlette.requests import Request

from services.settings import Network, trusted_proxies

__all__ = ["client_address", "trusted_proxies"]

MAX_ADDRESS_LENGTH = 64


def _trusted(address: str, trusted: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def client_address(request: Request, trusted: Sequence[Network]) -> str:
    """The socket's peer, or, behind trusted proxies, the first untrusted hop of
    `X-Forwarded-For` read from the right."""
    peer = request.client.host if request.client else "unknown"
    if not trusted or not _trusted(peer, trusted):
        return peer
    hops = [h.strip() for h in request.headers.get("x-forwarded-for", "").split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, trusted):
            return hop[:MAX_ADDRESS_LENGTH]
    return hops[0][:MAX_ADDRESS_LENGTH] if hops else peer
