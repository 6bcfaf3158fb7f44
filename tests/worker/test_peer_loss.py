"""``services.worker.peer_loss`` on real errors: two real gloo ranks (tests/worker/gloo_peers.py)
all-reduce on 127.0.0.1 and one of them is SIGKILLed (the other's connection is reset), or
SIGSTOPped (the other's collective times out), or the store's host never comes (the rendezvous
fails); each survivor's own exception is a lost peer. Errors of training (a bad value, a shape
mismatch raised by torch) are not, and neither is a rank that exited on its own error;
a rank killed by a signal is."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
from typing import Any

import gloo_peers
import pytest
import torch

from services.ports import free_port
from services.worker.peer_loss import killed, lost_peer

pytestmark = pytest.mark.slow  # real gloo ranks: each spawned process imports torch

COLLECTIVE_TIMEOUT_S = 3.0


def survivor_says(victim: int, sig: signal.Signals) -> tuple[int, bool, str]:
    """Two gloo ranks all-reducing; ``sig`` sent to ``victim``; what the other one died of."""
    spawn = multiprocessing.get_context("spawn")
    pids, results = spawn.Queue(), spawn.Queue()
    port = free_port()
    ranks = [spawn.Process(target=gloo_peers.all_reduce_until_it_fails,
                           args=(rank, port, COLLECTIVE_TIMEOUT_S, pids, results)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    try:
        joined = dict(pids.get(timeout=120) for _ in ranks)  # both in the group, all-reducing
        os.kill(joined[victim], sig)
        return results.get(timeout=60)  # type: ignore[no-any-return]
    finally:
        for process in ranks:
            process.kill()
            process.join()


@pytest.mark.parametrize("victim", [0, 1], ids=["store host killed", "peer killed"])
def test_a_killed_gloo_peer_is_a_lost_peer(victim: int) -> None:
    rank, verdict, text = survivor_says(victim, signal.SIGKILL)
    assert rank == 1 - victim
    assert verdict, text  # gloo: "RuntimeError: [.../gloo/transport/tcp/pair.cc:...] ... reset by peer"


def test_a_stopped_gloo_peer_times_the_collective_out_and_is_a_lost_peer() -> None:
    rank, verdict, text = survivor_says(1, signal.SIGSTOP)
    assert rank == 0
    assert verdict and "Timed out" in text, text


def test_a_rendezvous_whose_store_host_is_gone_is_a_lost_peer() -> None:
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    rank = spawn.Process(target=gloo_peers.join_a_store_that_is_gone, args=(port, results))
    rank.start()
    try:
        _, verdict, text = results.get(timeout=120)
    finally:
        rank.kill()
        rank.join()
    assert verdict, text
    assert text.startswith(("DistNetworkError", "DistStoreError")), text  # c10d's classes


def test_node_0s_worker_killed_ends_the_other_nodes_rank_as_a_lost_peer() -> None:
    """The store lives in node 0's worker now: killing that worker kills its rank 0 (it dies
    with its parent) and the rank of the other node, all-reducing with it, loses its peer."""
    spawn = multiprocessing.get_context("spawn")
    ports, pids, results = spawn.Queue(), spawn.Queue(), spawn.Queue()
    worker = spawn.Process(target=gloo_peers.lead, args=(COLLECTIVE_TIMEOUT_S, ports, pids, results))
    worker.start()
    other = spawn.Process(target=gloo_peers.all_reduce_at_a_served_store,
                          args=(1, ports.get(timeout=120), COLLECTIVE_TIMEOUT_S, pids, results))
    other.start()
    try:
        joined = dict(pids.get(timeout=120) for _ in range(3))  # the worker, both ranks all-reducing
        os.kill(joined["worker"], signal.SIGKILL)
        rank, verdict, text = results.get(timeout=60)
        assert rank == 1 and verdict, text
        worker.join(10)
        assert not pid_alive(joined[0])  # rank 0 died with its worker, store and all
    finally:
        for process in (worker, other):
            process.kill()
            process.join()


def pid_alive(pid: int, wait_s: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(")")[-1].split()[0] == "Z":  # a zombie: dead, not reaped yet
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.1)
    return True


def raised(action: Any) -> BaseException:
    try:
        action()
    except Exception as exc:
        return exc
    raise AssertionError("did not raise")


def test_errors_of_training_are_not_a_lost_peer() -> None:
    shapes = raised(lambda: torch.ones(2, 3) @ torch.ones(2, 3))  # torch's own RuntimeError
    assert isinstance(shapes, RuntimeError) and not lost_peer(shapes)
    assert not lost_peer(ValueError("micro_batch_size must divide the window"))

    def while_handling() -> None:
        try:
            raise KeyError("model")
        except KeyError as exc:
            raise RuntimeError("checkpoint has no model") from exc

    assert not lost_peer(raised(while_handling))


def test_a_lost_peer_under_a_training_error_is_a_lost_peer() -> None:
    def wrapped() -> None:
        try:
            raise TimeoutError("collective timed out")
        except TimeoutError as exc:
            raise RuntimeError("could not write the checkpoint") from exc

    assert lost_peer(raised(wrapped))


def test_a_rank_killed_by_a_signal_is_lost_one_that_exited_on_its_error_is_not() -> None:
    spawn = multiprocessing.get_context("spawn")
    for target, expected in ((os.abort, True), (exit_on_an_error, False)):
        process = spawn.Process(target=target)
        process.start()
        process.join(60)
        assert killed(process.exitcode) is expected, process.exitcode
    assert not killed(None) and not killed(0)


def exit_on_an_error() -> None:
    raise SystemExit(1)
