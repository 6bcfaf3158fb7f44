"""An attempt's rendezvous: torch.distributed's TCPStore, served by the worker process that leads
the attempt (the one that spawns the ranks of a ``gpus: k`` job, or node 0's of a ``nodes: n``
gang), and joined by every rank as a client that presents the attempt's secret.

    server = open_server(candidates, address=..., timeout_s=...)  # binds now: the port is ours
    ...                                            # record / pass on server.port, server.secret
    store = join_store(addr, port, prefix, secret, timeout_s)     # in each rank
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    server.close()                                 # once the attempt's ranks are gone

c10d's TCPStore has no authentication (any client that reaches its port may list, read and
write every key) and binds every interface. So the store itself listens on a loopback port of
the leader's only, on a socket this module binds and hands to torch (``master_listen_fd``),
and what the attempt advertises is a gate: a socket bound to the advertised address only
(``ACCUM_ADVERTISE_ADDRESS``: 127.0.0.1 is reachable from this host alone), whose connections
are relayed to the store once they sent ``HANDSHAKE``, the attempt's secret (32 random bytes,
new per attempt) and a newline; anything else is closed unanswered. A rank's store client
speaks c10d's protocol, so it connects to a tunnel of its own process (loopback, an OS port)
that opens the connection to the gate and presents the secret first; the tunnel relays only
connections made from its own process. The leader hands the secret to its spawned ranks in
their arguments and records it with the endpoint for a gang's other nodes (the job database,
which the workers trust already); never in an event, a log line or the API.

The port is bound when it is chosen, so another process (a second gang led from this host,
any program) cannot take it in between, and two attempts never meet in one store. A port
already bound by something else is skipped. The server lives in the worker: when that process
dies (a node-0 worker SIGKILLed), its ranks die with it (``parent_death.die_with_parent``) and
the other nodes' ranks lose those peers (``services.worker.peer_loss``): the gate's
connections close, and so do the tunnels'. Imported lazily: it loads torch.distributed.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import os
import secrets
import socket
import threading
from collections.abc import Iterable
from datetime import timedelta

import torch.distributed as dist

from services.worker.place import LOOPBACK

ANY_PORT = 0  # the OS picks a free one; ``server.port`` reads back the one bound
# What a connection to the gate sends before the secret: a rank's tunnel, and nothing else (a
# c10d client's first bytes differ, so it is turned away at once, without reading a secret).
HANDSHAKE = b"accum-rendezvous/1 "
HANDSHAKE_TIMEOUT_S = 10.0  # a connection that sends less than the handshake in this is closed
BACKLOG = 128
CHUNK = 65536


class PortsTaken(RuntimeError):
    """No port of the candidates could be bound; the message says which and how to widen them."""


def new_secret() -> str:
    """A fresh attempt secret: 32 random bytes as hex (what the gate compares)."""
    return secrets.token_hex(32)


def _listener(address: str, port: int) -> socket.socket:
    """A TCP socket listening on ``address:port`` only (OSError when taken)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as c10d does: TIME_WAIT
        sock.bind((address, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either end closes, then close both (the other
    direction's copy ends with them)."""
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()


def _relay(one: socket.socket, other: socket.socket) -> None:
    """Relay both directions between two connected sockets, each on a daemon thread."""
    for source, sink in ((one, other), (other, one)):
        threading.Thread(target=_pipe, args=(source, sink), daemon=True, name="rendezvous-relay").start()


def _read_exactly(conn: socket.socket, size: int, public: bytes = b"") -> bytes:
    """``size`` bytes from ``conn`` (fewer when it closes); with ``public``, stops as soon as
    what came differs from it (only for text that is no secret: the stop tells how far it matched)."""
    data = b""
    while len(data) < size and (not public or public.startswith(data)):
        chunk = conn.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _accept_loop(listener: socket.socket, serve: object) -> None:
    """Accept until ``listener`` is closed; each connection goes to ``serve`` on a thread."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # closed: the attempt ended
            return
        threading.Thread(target=serve, args=(conn,), daemon=True, name="rendezvous-accept").start()  # type: ignore[arg-type]


class Server:
    """The attempt's store and its gate, open from ``open_server`` until ``close``: ``port``
    (the gate's, on the advertised address) and ``secret`` (what a rank presents there)."""

    def __init__(self, gate: socket.socket, store: dist.TCPStore, store_port: int, secret: str) -> None:
        self._gate = gate
        self._store: dist.TCPStore | None = store
        self._store_port = store_port
        self._expected = HANDSHAKE + secret.encode() + b"\n"
        self.port = int(gate.getsockname()[1])
        self.secret = secret
        threading.Thread(target=_accept_loop, args=(gate, self._admit), daemon=True,
                         name="rendezvous-gate").start()

    def _admit(self, conn: socket.socket) -> None:
        """Relay ``conn`` to the store once it presented the secret; else close it."""
        try:
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            # The public prefix first (a stray client goes at once); the secret then in full,
            # compared in constant time: how far a guess matched is never told by when it closes.
            if _read_exactly(conn, len(HANDSHAKE), public=HANDSHAKE) != HANDSHAKE:
                raise PermissionError
            if not hmac.compare_digest(_read_exactly(conn, len(self._expected) - len(HANDSHAKE)),
                                       self._expected[len(HANDSHAKE):]):
                raise PermissionError
            conn.settimeout(None)
            store = socket.create_connection((LOOPBACK, self._store_port))
        except (OSError, PermissionError):
            conn.close()
            return
        _relay(conn, store)

    def close(self) -> None:
        """Stop serving: the gate now (shut down first: a close alone leaves the port bound while
        the accept thread waits in it); torch stops the store when the last reference goes."""
        with contextlib.suppress(OSError):
            self._gate.shutdown(socket.SHUT_RDWR)
        self._gate.close()
        self._store = None


def open_server(candidates: Iterable[int], *, address: str = LOOPBACK, timeout_s: float,
                what: str) -> Server:
    """The attempt's store, gated on ``address`` at the first of ``candidates`` that binds there
    (one taken by another process is skipped), with a new secret. Raises ``PortsTaken`` naming
    ``what`` (where the candidates come from, and how to widen them) when none binds."""
    tried, last = 0, ""
    for port in candidates:
        tried += 1
        try:
            gate = _listener(address, port)
        except OSError as exc:  # EADDRINUSE: another process holds it
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) or isinstance(exc, socket.gaierror):
                raise PortsTaken(
                    f"cannot listen on {address!r} (ACCUM_ADVERTISE_ADDRESS): {exc.strerror or exc}; "
                    "set it to an address of this node's own interfaces, the one the other "
                    "nodes reach (a name must resolve to it here too, not to 127.0.1.1)") from exc
            last = f"{address}:{port}: {exc.strerror or exc}"
            continue
        inner = _listener(LOOPBACK, ANY_PORT)
        try:
            store = dist.TCPStore(LOOPBACK, inner.getsockname()[1], None, is_master=True,
                                  timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                                  master_listen_fd=inner.fileno())
        except BaseException:
            inner.close()
            gate.close()
            raise
        store_port = inner.getsockname()[1]
        inner.detach()  # the store owns the listening socket now (and closes it)
        return Server(gate, store, store_port, new_secret())
    raise PortsTaken(f"no port free for the rendezvous: {tried} tried, all in use ({what}); "
                     f"last error: {last or 'none tried'}")


def _own_connection(conn: socket.socket) -> bool:
    """Whether the peer of ``conn`` (accepted on loopback) is a socket of this very process:
    its entry in /proc/net/tcp or tcp6 (c10d's client is an IPv6 socket, v4-mapped), by
    ports, names an inode one of our descriptors holds."""
    peer_port, here_port = conn.getpeername()[1], conn.getsockname()[1]
    want = f":{peer_port:04X}", f":{here_port:04X}"
    inodes = set()
    try:
        for name in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(name) as table:
                for line in table.readlines()[1:]:
                    fields = line.split()
                    if fields[1].endswith(want[0]) and fields[2].endswith(want[1]):
                        inodes.add(f"socket:[{fields[9]}]")
        mine = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                mine.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                continue
    except OSError:
        return False
    return bool(inodes & mine)


class Tunnel:
    """A rank's way to the gate: a loopback port of this process whose connections (this
    process's store clients only) are relayed to ``addr:port`` after the handshake."""

    def __init__(self, addr: str, port: int, secret: str, timeout_s: float) -> None:
        self._target = (addr, port)
        self._hello = HANDSHAKE + secret.encode() + b"\n"
        self._timeout_s = timeout_s
        self._listener = _listener(LOOPBACK, ANY_PORT)
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=_accept_loop, args=(self._listener, self._open), daemon=True,
                         name="rendezvous-tunnel").start()

    def _open(self, conn: socket.socket) -> None:
        if not _own_connection(conn):
            conn.close()
            return
        try:
            gate = socket.create_connection(self._target, timeout=self._timeout_s)
            gate.settimeout(None)
            gate.sendall(self._hello)
        except OSError:
            conn.close()  # the store client sees the connection fail: a lost peer
            return
        _relay(conn, gate)


_tunnels: list[Tunnel] = []  # a rank's tunnels live as long as the rank (its store clients do)


def join_store(addr: str, port: int, prefix: str, secret: str, timeout_s: float) -> dist.Store:
    """A rank's client of the attempt's store behind the gate at ``addr:port``, presenting
    ``secret``, its keys under ``prefix`` (the job and attempt). A gate that cannot be reached
    within ``timeout_s`` raises c10d's ``DistNetworkError`` / ``DistStoreError``: a lost peer
    (``services.worker.peer_loss``)."""
    tunnel = Tunnel(addr, port, secret, timeout_s)
    _tunnels.append(tunnel)
    client = dist.TCPStore(LOOPBACK, tunnel.port, None, is_master=False,
                           timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    return dist.PrefixStore(prefix, client)
