"""``free_port()``: a local TCP port nothing listens on now, for the servers accum starts
(``accum demo``'s API) and those its tests start. Not for a rendezvous: another process can
take the port before it is bound (``services.worker.rendezvous`` binds as it picks)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS picks on ``host`` (a race with another process taking it is rare)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
