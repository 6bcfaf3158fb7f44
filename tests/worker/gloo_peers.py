"""Two real gloo ranks for ``tests/worker/test_peer_loss.py``: each joins a process group on
127.0.0.1 and all-reduces until it fails; the parent then kills or stops one of them. The
survivor classifies what it died of with ``services.worker.peer_loss.lost_peer`` in its own
process (the real exception object, its chain included) and reports ``(rank, verdict, text)``."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any


def all_reduce_until_it_fails(rank: int, port: int, timeout_s: float, pids: Any, results: Any) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s))
    pids.put((rank, os.getpid()))
    all_reduce_and_report(rank, results)


def all_reduce_and_report(rank: int, results: Any) -> None:
    """All-reduce in this rank's process group until it fails; report what it died of."""
    import torch
    import torch.distributed as dist

    from services.worker.peer_loss import lost_peer

    tensor = torch.ones(1000)
    try:
        while True:
            dist.all_reduce(tensor)
    except Exception as exc:
        results.put((rank, lost_peer(exc), f"{type(exc).__name__}: {exc}"))


def join_a_store_that_is_gone(port: int, results: Any) -> None:
    """Rank 1 of a world whose rank 0 (the store's host) never comes: the rendezvous fails."""
    import torch.distributed as dist

    from services.worker.peer_loss import lost_peer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=1, world_size=2, timeout=timedelta(seconds=2))
    except Exception as exc:
        results.put((1, lost_peer(exc), f"{type(exc).__name__}: {exc}"))


def all_reduce_at_a_served_store(rank: int, endpoint: tuple[int, str], timeout_s: float, pids: Any,
                                 results: Any) -> None:
    """A rank as the service runs one: a client of the store its worker serves (``endpoint``:
    its port and the attempt's secret), SIGKILLed when that worker dies (``die_with_parent``);
    all-reduces until it fails, then reports."""
    import torch.distributed as dist

    from services.worker.parent_death import die_with_parent
    from services.worker.rendezvous import join_store

    die_with_parent()
    store = join_store("127.0.0.1", endpoint[0], "job/1/", endpoint[1], timeout_s)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=timedelta(seconds=timeout_s))
    pids.put((rank, os.getpid()))
    all_reduce_and_report(rank, results)


def lead(timeout_s: float, ports: Any, pids: Any, results: Any) -> None:
    """Node 0's worker: serve the attempt's store, spawn rank 0 there, then wait to be killed."""
    import multiprocessing
    import time

    from services.worker.rendezvous import ANY_PORT, open_server

    server = open_server([ANY_PORT], timeout_s=timeout_s, what="test")
    endpoint = (server.port, server.secret)
    rank = multiprocessing.get_context("spawn").Process(
        target=all_reduce_at_a_served_store, args=(0, endpoint, timeout_s, pids, results))
    rank.start()
    ports.put(endpoint)
    pids.put(("worker", os.getpid()))
    while True:
        time.sleep(1)


def all_reduce_once_and_wait(rank: int, endpoint: tuple[int, str], timeout_s: float, done: Any,
                             results: Any) -> None:
    """A rank of a 2-rank gloo group at the store its worker serves: write a key of its own
    (``rank<r>``), all-reduce rank + 1 once, report ``(rank, sum)``, and stay in the group (its
    keys in the store) until ``done``."""
    import torch
    import torch.distributed as dist

    from services.worker.rendezvous import join_store

    store = join_store("127.0.0.1", endpoint[0], "job/1/", endpoint[1], timeout_s)
    store.set(f"rank{rank}", str(os.getpid()))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=timedelta(seconds=timeout_s))
    tensor = torch.tensor([rank + 1.0])
    dist.all_reduce(tensor)
    results.put((rank, float(tensor)))
    done.wait(120)
    dist.destroy_process_group()
