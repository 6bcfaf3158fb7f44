"""An attempt's rendezvous: torch.distributed's TCPStore, served by the worker process that leads
the attempt (the one that spawns the ranks of a ``gpus: k`` job, or node 0's of a ``nodes: n``
gang), and joined by every rank as a client.

    server = open_server(candidates, timeout_s=...)    # binds now: the port cannot be taken
    ...                                                 # record / pass on server.port
    store = join_store(addr, port, prefix, timeout_s)  # in each rank
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    server.close()                                      # once the attempt's ranks are gone

The port is bound when it is chosen, so another process (a second gang led from this host,
any program) cannot take it in between, and two attempts never meet in one store. A port
already bound by something else is skipped. The server lives in the worker: when that process
dies (a node-0 worker SIGKILLed), its ranks die with it (``parent_death.die_with_parent``) and
the other nodes' ranks lose those peers (``services.worker.peer_loss``). Imported lazily: it
loads torch.distributed.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import torch.distributed as dist

from services.worker.place import LOOPBACK

ANY_PORT = 0  # the OS picks a free one; ``server.port`` reads back the one bound


class PortsTaken(RuntimeError):
    """No port of the candidates could be bound; the message says which and how to widen them."""


class Server:
    """The attempt's TCPStore server, open from ``open_server`` until ``close``."""

    def __init__(self, store: dist.TCPStore) -> None:
        self._store: dist.TCPStore | None = store
        self.port = int(store.port)

    def close(self) -> None:
        """Stop serving: torch stops the server when the last reference to its store goes."""
        self._store = None


def open_server(candidates: Iterable[int], *, timeout_s: float, what: str) -> Server:
    """A TCPStore server listening on the first of ``candidates`` that binds (torch binds every
    interface; ``LOOPBACK`` is only where this process's own client of it connects); one taken by another process is skipped. Raises
    ``PortsTaken`` naming ``what`` (where the candidates come from, and how to widen them)
    when none binds."""
    tried, last = 0, ""
    for port in candidates:
        tried += 1
        try:
            store = dist.TCPStore(LOOPBACK, port, None, is_master=True,
                                  timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        except dist.DistNetworkError as exc:  # EADDRINUSE: another process holds it
            last = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            continue
        return Server(store)
    raise PortsTaken(f"no port free for the rendezvous: {tried} tried, all in use ({what}); "
                     f"last error: {last or 'none tried'}")


def join_store(addr: str, port: int, prefix: str, timeout_s: float) -> dist.Store:
    """A rank's client of the attempt's server at ``addr:port``, its keys under ``prefix`` (the
    job and attempt: a stale rank of another attempt that reaches this port reads none of
    them). A server that cannot be reached within ``timeout_s`` raises c10d's
    ``DistNetworkError`` / ``DistStoreError``: a lost peer (``services.worker.peer_loss``)."""
    client = dist.TCPStore(addr, port, None, is_master=False, timeout=timedelta(seconds=timeout_s),
                           wait_for_workers=False)
    return dist.PrefixStore(prefix, client)
