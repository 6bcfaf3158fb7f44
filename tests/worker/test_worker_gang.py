"""services/worker/gang.py on two worker processes as two nodes (each its own ACCUM_HOME, one
database): both get the same gang, consistent node ranks and node 0's endpoint, and meet there
through torch.distributed's TCPStore, all on 127.0.0.1. A gang short of a node raises at the
timeout with the reason; node 0 serves its store on a port of the range that no running gang
recorded and no other process holds, bound as it is picked."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from job_specs import MINIMAL_SPEC
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import jobs
from services.jobdb.gangs import members_of
from services.jobdb.models import Job, Owner
from services.jobdb.tokens import create_owner_with_token
from services.ports import free_port
from services.settings import Settings
from services.spec import parse_spec
from services.worker.gang import GangNotFormed, claim_seat, open_rendezvous, wait_for_gang
from services.worker.rendezvous import PortsTaken, join_store

REPO = Path(__file__).resolve().parents[2]

# One node: join the job's gang, wait for it, then meet the other node at node 0's TCPStore.
NODE = """
import json, os, sys, time
from services.settings import get_settings
from services.worker.gang import claim_seat, wait_for_gang
from services.worker.rendezvous import join_store
settings = get_settings()
seat = claim_seat(settings, sys.argv[1], sys.argv[2])
place = wait_for_gang(settings, seat)
# Node 0's worker serves the store (place.server); both nodes are its clients, with its secret.
store = join_store(place.master_addr, place.master_port, seat.job_id + "/", place.master_secret, 30)
store.set(f"node{place.node_rank}", sys.argv[2])
peers = [store.get(f"node{rank}").decode() for rank in range(place.nnodes)]
print(json.dumps(dict(job=seat.job_id, node_rank=place.node_rank, nnodes=place.nnodes,
                      addr=place.master_addr, port=place.master_port, peers=peers,
                      serves=place.server is not None)))
store.barrier("read", place.nnodes)  # no node leaves (node 0 closing the store) before every node read it
# ... and node 0 not before the others are out of the store: each says so by a file in the
# folder the nodes share (a store key would race node 0's exit against the reply that its
# worker's gate relays: services.worker.rendezvous).
if place.server is not None:
    deadline = time.monotonic() + 60
    while not all(os.path.exists(f"left{rank}") for rank in range(1, place.nnodes)):
        assert time.monotonic() < deadline, "a node never said it left the store"
        time.sleep(0.05)
else:
    open(f"left{place.node_rank}", "w").close()
"""


@pytest.fixture
def gang_job(session_factory: sessionmaker[Session]) -> Callable[[int], Job]:
    def make(nodes: int) -> Job:
        with session_factory.begin() as session:
            owner: Owner = create_owner_with_token(session, "alice")[0]
            spec = parse_spec(dict(MINIMAL_SPEC, nodes=nodes)).normalised()
            return jobs.create_job(session, owner=owner, spec=spec)[0]
    return make


def port_range_here() -> str:
    low = min(free_port(), 65535 - 20)
    return f"{low}-{low + 20}"


def node_env(home: Path, database_url: str, ports: str) -> dict[str, str]:
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCUM_")}
    return dict(env, ACCUM_HOME=str(home), ACCUM_DATABASE_URL=database_url,
                ACCUM_ADVERTISE_ADDRESS="127.0.0.1", ACCUM_RENDEZVOUS_PORTS=ports,
                ACCUM_GANG_FORM_TIMEOUT_S="60",
                PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))


@pytest.mark.slow
def test_two_nodes_agree_on_their_places_and_meet_at_node_0(
    tmp_path: Path, store_settings: Settings, session_factory: sessionmaker[Session],
    gang_job: Callable[[int], Job],
) -> None:
    job = gang_job(2)
    ports = port_range_here()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-c", NODE, job.id, f"worker{n}@node{n}"],
            env=node_env(tmp_path / f"node{n}", str(store_settings.database_url), ports),
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for n in (1, 2)
    ]
    answers: list[dict[str, Any]] = []
    for node in nodes:
        out, err = node.communicate(timeout=120)
        assert node.returncode == 0, err[-3000:]
        answers.append(json.loads(out.strip().splitlines()[-1]))
    assert {a["job"] for a in answers} == {job.id}
    assert sorted(a["node_rank"] for a in answers) == [0, 1]
    assert {(a["nnodes"], a["addr"], a["port"]) for a in answers} == {
        (2, "127.0.0.1", answers[0]["port"])}
    assert {a["node_rank"]: a["serves"] for a in answers} == {0: True, 1: False}
    low, high = map(int, ports.split("-"))
    assert low <= answers[0]["port"] <= high
    with session_factory() as session:
        by_rank = {m.node_rank: m.worker for m in members_of(session, job.id)}
        row = session.get(Job, job.id)
        assert row is not None and row.status == "running"
    # Each node's TCPStore read what every node wrote, in node-rank order.
    assert all(a["peers"] == [by_rank[0], by_rank[1]] for a in answers)


def test_a_node_alone_gets_the_reason_when_its_gang_does_not_form(
    store_settings: Settings, session_factory: sessionmaker[Session],
    gang_job: Callable[[int], Job],
) -> None:
    job = gang_job(2)
    settings = store_settings.model_copy(update={"gang_form_timeout_s": 0.5})
    seat = claim_seat(settings, job.id, "alone@node1")
    assert seat is not None and seat.node_rank == 0
    with pytest.raises(GangNotFormed, match=r"1 of 2 workers .* within 0.5 s"):
        wait_for_gang(settings, seat)
    with session_factory() as session:
        row = session.get(Job, job.id)
        assert members_of(session, job.id) == [] and row is not None and row.status == "queued"


def test_node_0_serves_its_store_on_a_port_no_gang_recorded_and_no_other_process_holds() -> None:
    low = min(free_port(), 65535 - 3)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", low + 1))
        busy.listen()
        # From the held port on (the start is random): it is tried, refused, and skipped.
        first = next(random.Random(seed) for seed in range(64) if random.Random(seed).randrange(2) == 0)
        server = open_rendezvous(f"{low}-{low + 2}", taken={low}, address="127.0.0.1", timeout_s=5, rng=first)
        try:
            assert server.port == low + 2
            client = join_store("127.0.0.1", server.port, "job/1/", server.secret, timeout_s=5)
            client.set("k", "v")  # it is the store, bound when picked: nothing can take it now
            assert client.get("k") == b"v"
            with pytest.raises(PortsTaken, match=r"ACCUM_RENDEZVOUS_PORTS .* widen the range"):
                open_rendezvous(f"{low}-{low + 2}", taken={low}, address="127.0.0.1", timeout_s=5)  # low+2: ours now
        finally:
            server.close()
        reopened = open_rendezvous(f"{low}-{low + 2}", taken={low}, address="127.0.0.1", timeout_s=5)  # closed: free again
        assert reopened.port == low + 2
        reopened.close()


def test_no_free_port_in_the_range_fails_the_job_and_ends_the_followers_wait(
    store_settings: Settings, session_factory: sessionmaker[Session],
    gang_job: Callable[[int], Job],
) -> None:
    job = gang_job(2)
    with socket.socket() as busy:  # the whole range: one port, another program's
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        settings = store_settings.model_copy(update={"rendezvous_ports": str(busy.getsockname()[1])})
        seats = [claim_seat(settings, job.id, f"w{n}@node{n}") for n in (0, 1)]
        assert [s.node_rank for s in seats if s is not None] == [0, 1]
        leader, follower = (s for s in seats if s is not None)
        with pytest.raises(GangNotFormed, match=r"ACCUM_RENDEZVOUS_PORTS '\d+' .* widen the range"):
            wait_for_gang(settings, leader)
    with pytest.raises(GangNotFormed, match="ended before node 0 opened its rendezvous"):
        wait_for_gang(settings, follower)
    with session_factory() as session:
        row = session.get(Job, job.id)
        assert row is not None and row.status == "failed"
        assert row.error is not None and row.error["type"] == "RendezvousPortsTaken"
        assert "ACCUM_RENDEZVOUS_PORTS" in row.error["message"]
