"""``free_port()``: a local TCP port nothing listens on now, for the servers and process
groups accum starts (DDP's rendezvous, ``accum demo``'s API) and those its tests start."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS picks on ``host`` (a race with another process taking it is rare)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
