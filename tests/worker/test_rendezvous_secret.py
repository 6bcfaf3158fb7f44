"""The attempt's rendezvous store (``services.worker.rendezvous``) under two real gloo ranks: it
listens on the advertised address only (127.0.0.1 here), and a client without the attempt's
secret neither joins it nor reads a key, while the ranks that presented it trained."""

from __future__ import annotations

import multiprocessing
import os
import socket
from datetime import timedelta
from pathlib import Path

import gloo_peers
import pytest
import torch.distributed as dist

from services.worker.rendezvous import ANY_PORT, HANDSHAKE, join_store, open_server

pytestmark = pytest.mark.slow  # two real gloo ranks: each spawned process imports torch (~20 s)

TIMEOUT_S = 30.0


def listening_addresses() -> set[tuple[str, int]]:
    """(address, port) of every TCP socket this process listens on, from /proc/net/tcp{,6}."""
    mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or f"socket:[{fields[9]}]" not in mine:  # 0A: LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc writes the address as 32-bit words in host order (little-endian here)
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, packed), int(hex_port, 16)))
    return found


def test_the_store_listens_on_the_advertised_address_and_admits_only_the_secrets_holders() -> None:
    server = open_server([ANY_PORT], address="127.0.0.1", timeout_s=TIMEOUT_S, what="test")
    spawn = multiprocessing.get_context("spawn")
    done, results = spawn.Event(), spawn.Queue()
    ranks = [spawn.Process(target=gloo_peers.all_reduce_once_and_wait,
                           args=(rank, (server.port, server.secret), TIMEOUT_S, done, results))
             for rank in (0, 1)]
    for process in ranks:
        process.start()
    try:
        assert sorted(results.get(timeout=120) for _ in ranks) == [(0, 3.0), (1, 3.0)]
        # Every socket this process listens on (the gate, the store behind it) is 127.0.0.1's:
        # no 0.0.0.0 or :: (c10d's own TCPStore binds every interface).
        listening = listening_addresses()
        assert ("127.0.0.1", server.port) in listening
        assert {address for address, _ in listening} == {"127.0.0.1"}, listening

        # A c10d client without the secret: turned away at its first bytes, never connected.
        with pytest.raises(dist.DistNetworkError):
            dist.TCPStore("127.0.0.1", server.port, None, is_master=False,
                          timeout=timedelta(seconds=1), wait_for_workers=False)
        # The handshake with a wrong secret: closed unanswered, nothing relayed.
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as guess:
            guess.sendall(HANDSHAKE + b"0" * len(server.secret) + b"\n")
            assert guess.recv(1) == b""
        with pytest.raises(dist.DistNetworkError):
            join_store("127.0.0.1", server.port, "job/1/", "0" * len(server.secret), 1)

        # The keys it was kept from are there: the ranks' own, read with the secret.
        holder = join_store("127.0.0.1", server.port, "job/1/", server.secret, 10)
        assert {int(holder.get(f"rank{rank}")) for rank in (0, 1)} == {p.pid for p in ranks}
    finally:
        done.set()
        for process in ranks:
            process.join(30)
            process.kill()
        server.close()
