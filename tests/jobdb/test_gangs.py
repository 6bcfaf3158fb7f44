"""Gang claims of `nodes: n` jobs (services/jobdb/gangs.py), on SQLite and PostgreSQL: one gang
forms per queue at a time, so two gang jobs never each hold part of the workers; concurrent
worker processes fill it; a gang that cannot form is settled at the timeout (started on
min_nodes, or released with an event). Clocks are passed in, not slept."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from job_specs import MINIMAL_SPEC
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from worker_rows import worker_row

from services.jobdb import jobs, leases
from services.jobdb import workers as store_workers
from services.jobdb.db import make_engine, make_session_factory
from services.jobdb.events import list_events
from services.jobdb.gangs import (
    Member,
    formable_jobs,
    gang_state,
    join_gang,
    members_of,
    ports_in_use,
    record_endpoint,
    settle_gang,
    settle_stale_gangs,
)
from services.jobdb.models import FormingGang, Job, Owner
from services.jobdb.types import utcnow
from services.settings import Settings
from services.spec import parse_spec

LEASE_S = 60.0
TIMEOUT_S = 30.0
FRESH_S = 6.0  # a registry row renewed within this is a live worker (live_within(2 s beats))


def member(n: int) -> Member:
    return Member(f"w{n}@node{n}", f"w{n}@node{n}/lease{n}", f"node{n}", None)


@pytest.fixture
def gang_job(session_factory: sessionmaker[Session], owner: Owner) -> Callable[..., Job]:
    """``gang_job(nodes, min_nodes=None)``: a queued job of ``owner`` on the default queue."""

    def make(nodes: int, min_nodes: int | None = None, seed: int = 0) -> Job:
        raw: dict[str, Any] = dict(MINIMAL_SPEC, nodes=nodes, seed=seed)
        if min_nodes is not None:
            raw["min_nodes"] = min_nodes
        with session_factory.begin() as session:
            job, _ = jobs.create_job(session, owner=owner, spec=parse_spec(raw).normalised())
        return job

    return make


def join(sessions: sessionmaker[Session], job_id: str, who: int, **kwargs: Any) -> Any:
    with sessions.begin() as session:
        return join_gang(session, job_id, member(who), lease_timeout_s=LEASE_S, **kwargs)


def _race(settings: Settings, job_id: str, who: int, start: Any, results: Any) -> None:
    """One worker process: wait for the others, then join the gang of its message's job."""
    engine = make_engine(settings)
    try:
        start.wait(timeout=60)
        seat = join(make_session_factory(engine), job_id, who)
        results.put((who, None if seat is None else (seat.job_id, seat.node_rank)))
    finally:
        engine.dispose()


def test_two_gang_jobs_on_three_workers_one_forms_the_other_holds_none(
    store_settings: Settings, session_factory: sessionmaker[Session], gang_job: Callable[..., Job],
) -> None:
    """Each job needs all 3 workers. Two forming gangs at once would split them (2 + 1, or
    1 + 2) and neither could start: the one forming gang per queue takes all three."""
    first, second = gang_job(3, seed=1), gang_job(3, seed=2)
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(3), context.Queue()
    messages = {1: first.id, 2: second.id, 3: second.id}  # one message each, as the broker hands them
    processes = [context.Process(target=_race, args=(store_settings, job_id, who, start, results))
                 for who, job_id in messages.items()]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    seats = dict(results.get(timeout=5) for _ in processes)
    formed = {seat[0] for seat in seats.values()}
    assert len(formed) == 1 and None not in seats.values()  # all three joined the same gang
    assert sorted(seat[1] for seat in seats.values()) == [0, 1, 2]
    (winner,) = formed
    loser = second.id if winner == first.id else first.id
    with session_factory() as session:
        running, waiting = session.get(Job, winner), session.get(Job, loser)
        assert running is not None and waiting is not None
        assert (running.status, running.attempts, waiting.status) == ("running", 1, "queued")
        nodes = members_of(session, winner)
        assert [m.node_rank for m in nodes] == [0, 1, 2]
        assert {m.worker for m in nodes} == {member(n).worker for n in (1, 2, 3)}
        assert running.lease_owner == nodes[0].worker_id  # node 0 holds the lease
        assert members_of(session, loser) == []
        assert session.scalars(select(FormingGang)).all() == []
        kinds = [e.kind for e in list_events(session, winner, limit=100)]
        assert "gang_formed" in kinds and "started" in kinds


def test_members_see_the_formed_gang_and_node_0_s_endpoint(
    session_factory: sessionmaker[Session], gang_job: Callable[..., Job],
) -> None:
    job = gang_job(2)
    leader = join(session_factory, job.id, 1)
    assert leader is not None and (leader.node_rank, leader.nodes, leader.opened) == (0, 2, True)
    with session_factory() as session:
        state = gang_state(session, leader)
        assert (state.formed, state.released, state.nnodes) == (False, False, 1)
    assert join(session_factory, job.id, 1) is None  # the same worker again: the message drops
    other = join(session_factory, job.id, 2)
    assert other is not None and (other.node_rank, other.opened) == (1, False)
    assert join(session_factory, job.id, 3) is None  # running now: not claimable
    with session_factory.begin() as session:
        assert gang_state(session, other).formed and gang_state(session, other).master_port is None
        record_endpoint(session, job.id, leader.attempt, "127.0.0.1", 29512, "s" * 64)
    with session_factory() as session:
        for seat in (leader, other):
            state = gang_state(session, seat)
            assert (state.formed, state.nnodes, state.master_addr, state.master_port) == (
                True, 2, "127.0.0.1", 29512)
            assert state.master_secret == "s" * 64 and "s" * 64 not in repr(state)
        assert ports_in_use(session, "127.0.0.1") == {29512}
        assert ports_in_use(session, "127.0.0.2") == set()


def test_a_worker_given_another_gang_job_joins_the_forming_one(
    session_factory: sessionmaker[Session], gang_job: Callable[..., Job],
) -> None:
    first, second = gang_job(2, seed=1), gang_job(2, seed=2)
    join(session_factory, first.id, 1)
    seat = join(session_factory, second.id, 2)
    assert seat is not None and (seat.job_id, seat.node_rank) == (first.id, 1)
    opened = join(session_factory, second.id, 3)  # the queue is free again: second's gang starts
    assert opened is not None and (opened.job_id, opened.node_rank, opened.opened) == (second.id, 0, True)


def test_a_gang_that_cannot_form_releases_its_workers_at_the_timeout(
    session_factory: sessionmaker[Session], gang_job: Callable[..., Job],
) -> None:
    job = gang_job(2)  # min_nodes 2: one worker is not enough
    t0 = utcnow()
    seat = join(session_factory, job.id, 1, now=t0)
    assert seat is not None
    with session_factory.begin() as session:
        early = settle_gang(session, "default", form_timeout_s=TIMEOUT_S, lease_timeout_s=LEASE_S,
                            now=t0 + timedelta(seconds=TIMEOUT_S - 1))
        assert early is None and len(members_of(session, job.id, seat.attempt)) == 1
    late = t0 + timedelta(seconds=TIMEOUT_S + 1)
    with session_factory.begin() as session:
        assert settle_stale_gangs(session, form_timeout_s=TIMEOUT_S, lease_timeout_s=LEASE_S,
                                  now=late) == {"default": "released"}
    with session_factory() as session:
        row = session.get(Job, job.id)
        assert row is not None and (row.status, row.attempts) == ("queued", 0)
        assert row.enqueued_at == late  # its message is sent again ACCUM_REQUEUE_AFTER_S later
        assert members_of(session, job.id) == []
        assert session.scalars(select(FormingGang)).all() == []
        state = gang_state(session, seat)
        assert state.released and not state.formed
        (event,) = [e for e in list_events(session, job.id, limit=100) if e.kind == "gang_released"]
        assert "1 of 2 workers of queue 'default'" in event.message
        assert "ACCUM_GANG_FORM_TIMEOUT_S" in event.message and state.reason == event.message
        assert event.data["joined"] == [member(1).worker]
    again = join(session_factory, job.id, 2)  # a later message starts a new gang
    assert again is not None and (again.node_rank, again.attempt) == (0, 1)


def test_a_gang_with_min_nodes_starts_on_what_it_has_at_the_timeout(
    session_factory: sessionmaker[Session], gang_job: Callable[..., Job],
) -> None:
    job = gang_job(3, min_nodes=2)
    t0 = utcnow()
    first, second = join(session_factory, job.id, 1, now=t0), join(session_factory, job.id, 2, now=t0)
    assert first is not None and second is not None
    with session_factory.begin() as session:
        assert settle_gang(session, "default", form_timeout_s=TIMEOUT_S, lease_timeout_s=LEASE_S,
                           now=t0 + timedelta(seconds=TIMEOUT_S)) == "formed"
    with session_factory() as session:
        row = session.get(Job, job.id)
        assert row is not None and (row.status, row.attempts, row.lease_owner) == (
            "running", 1, member(1).worker_id)
        assert gang_state(session, second).formed and gang_state(session, second).nnodes == 2
        (event,) = [e for e in list_events(session, job.id, limit=100) if e.kind == "gang_formed"]
        assert event.message.startswith("2 of 3 nodes")


def test_a_worker_with_fewer_ranks_than_a_node_runs_does_not_join(
    session_factory: sessionmaker[Session], owner: Owner,
) -> None:
    spec = parse_spec(dict(MINIMAL_SPEC, nodes=2, gpus=2)).normalised()
    with session_factory.begin() as session:
        job, _ = jobs.create_job(session, owner=owner, spec=spec)
        small = Member("cpu@n1", "cpu@n1/1", "n1", None, ranks=0)
        assert join_gang(session, job.id, small, lease_timeout_s=LEASE_S) is None
        assert session.scalars(select(FormingGang)).all() == []  # holds nothing for it either
        big = Member("gpu@n2", "gpu@n2/1", "n2", "2 x A100", ranks=2)
        seat = join_gang(session, job.id, big, lease_timeout_s=LEASE_S)
        assert seat is not None and seat.node_rank == 0


def test_one_worker_alone_never_claims_a_gang_job(
    session_factory: sessionmaker[Session], gang_job: Callable[..., Job],
) -> None:
    job = gang_job(2)
    with session_factory.begin() as session:
        assert leases.claim_job(session, job.id, "alone/1", "node1", None, LEASE_S) is None
    single = gang_job(1, seed=5)
    with session_factory.begin() as session:
        claimed = leases.claim_job(session, single.id, "alone/1", "node1", None, LEASE_S)
        assert claimed is not None and claimed.status == "running"


def test_a_gang_job_cancelled_while_forming_frees_the_queue(
    session_factory: sessionmaker[Session], gang_job: Callable[..., Job],
) -> None:
    cancelled, other = gang_job(2, seed=1), gang_job(2, seed=2)
    join(session_factory, cancelled.id, 1)
    with session_factory.begin() as session:
        job = session.get(Job, cancelled.id)
        assert job is not None
        job.status = "cancelled"
    assert join(session_factory, other.id, 2) is None  # finds the dead gang and clears it
    seat = join(session_factory, other.id, 2)
    assert seat is not None and (seat.job_id, seat.node_rank) == (other.id, 0)
    with session_factory() as session:
        assert members_of(session, cancelled.id) == []


def test_a_gang_that_cannot_form_now_holds_no_worker_and_comes_back_once_it_can(
    session_factory: sessionmaker[Session], gang_job: Callable[..., Job],
) -> None:
    """Issue 40: w2 trains another job, so w1 opens no gang for a nodes: 2 job (it would hold
    w1 for the gang-form timeout); ``formable_jobs`` names the job once w2 is free, and the
    gang then forms as before."""
    job, other = gang_job(2), gang_job(1, seed=3)
    t0 = utcnow()
    with session_factory.begin() as session:
        for n in (1, 2):
            store_workers.register(session, worker_row(member(n).worker, ["default"]), now=t0)
        assert leases.claim_job(session, other.id, "w2/1", "node2", None, LEASE_S,
                                worker_name=member(2).worker) is not None
    assert join(session_factory, job.id, 1, now=t0, fresh_s=FRESH_S) is None
    with session_factory.begin() as session:
        assert session.scalars(select(FormingGang)).all() == []
        (event,) = [e for e in list_events(session, job.id, limit=100) if e.kind == "gang_waiting"]
        assert event.data["free"] == [member(1).worker] and event.data["busy"] == {member(2).worker: other.id}
        assert formable_jobs(session, None, older_than=t0 + timedelta(seconds=1), now=t0, fresh_s=FRESH_S) == []
        finished = session.get(Job, other.id)
        assert finished is not None
        finished.status = "succeeded"
    with session_factory() as session:
        assert formable_jobs(session, None, older_than=t0 + timedelta(seconds=1), now=t0,
                             fresh_s=FRESH_S) == [job.id]
    opened = join(session_factory, job.id, 1, now=t0, fresh_s=FRESH_S)
    assert opened is not None and opened.opened  # w2 is free: the gang waits for it
    assert join(session_factory, job.id, 2, now=t0, fresh_s=FRESH_S) is not None
    with session_factory() as session:
        assert gang_state(session, opened).formed


def test_min_nodes_with_nobody_free_left_forms_at_once(
    session_factory: sessionmaker[Session], gang_job: Callable[..., Job],
) -> None:
    """Issue 40: after a lost node the survivor forms its gang as soon as the lost worker's
    registry row is stale, not after the gang-form timeout (nobody free is left to wait for)."""
    job = gang_job(2, min_nodes=1)
    t0 = utcnow()
    with session_factory.begin() as session:
        store_workers.register(session, worker_row(member(1).worker, ["default"]), now=t0)
        store_workers.register(session, worker_row(member(2).worker, ["default"]),
                               now=t0 - timedelta(seconds=FRESH_S + 1))  # killed: no renewal since
    seat = join(session_factory, job.id, 1, now=t0, fresh_s=FRESH_S)
    assert seat is not None and not seat.opened  # formed: no invitation to send
    with session_factory() as session:
        row = session.get(Job, job.id)
        assert row is not None and (row.status, row.lease_owner) == ("running", member(1).worker_id)
        assert gang_state(session, seat).formed and gang_state(session, seat).nnodes == 1
