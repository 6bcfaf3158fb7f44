"""The worker registry's table: register (and re-register), renew, stop, states decided from
the clock (idle, busy, lost, stopped), the current job, and what a queue's workers offer."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from worker_rows import worker_row as row

from services.jobdb import leases
from services.jobdb import workers as store_workers
from services.jobdb.models import Job
from services.jobdb.types import utcnow

LEASE_S = 60.0


def states(session_factory: sessionmaker[Session], **kwargs: Any) -> dict[str, str]:
    with session_factory() as session:
        return {v.row.name: v.state for v in store_workers.list_workers(session, LEASE_S, **kwargs)}


def test_registered_workers_are_listed_idle_then_stopped_after_a_clean_shutdown(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        store_workers.register(session, row("gpu0@node1", ["a100"], gpus=1))
        store_workers.register(session, row("cpu@node2", ["default"]))
    assert states(session_factory) == {"cpu@node2": "idle", "gpu0@node1": "idle"}
    with session_factory() as session:
        listed = {v.row.name: v.row for v in store_workers.list_workers(session, LEASE_S)}
    assert listed["gpu0@node1"].queues == ["a100"] and listed["gpu0@node1"].gpus == 1
    assert listed["gpu0@node1"].devices[0]["name"] == "NVIDIA A100"

    with session_factory.begin() as session:
        store_workers.mark_stopped(session, "cpu@node2")
    assert states(session_factory)["cpu@node2"] == "stopped"
    # Started again under the same name: a fresh row, alive again.
    with session_factory.begin() as session:
        store_workers.register(session, row("cpu@node2", ["default", "cpu"]))
    assert states(session_factory)["cpu@node2"] == "idle"
    with session_factory() as session:
        again = {v.row.name: v.row for v in store_workers.list_workers(session, LEASE_S)}
    assert again["cpu@node2"].queues == ["default", "cpu"] and again["cpu@node2"].stopped_at is None


def test_a_worker_silent_for_the_lease_timeout_is_lost_and_renewal_brings_it_back(
    session_factory: sessionmaker[Session],
) -> None:
    start = utcnow()
    with session_factory.begin() as session:
        store_workers.register(session, row("w@n", ["default"]), now=start)
    later = start + timedelta(seconds=LEASE_S + 1)
    assert states(session_factory, now=start + timedelta(seconds=LEASE_S - 1)) == {"w@n": "idle"}
    assert states(session_factory, now=later) == {"w@n": "lost"}
    with session_factory.begin() as session:
        assert store_workers.renew(session, "w@n", now=later)
        assert not store_workers.renew(session, "nobody@n", now=later)  # register first
    assert states(session_factory, now=later) == {"w@n": "idle"}


def test_a_worker_holding_a_job_is_busy_with_that_job(
    session_factory: sessionmaker[Session], make_job: Any
) -> None:
    job: Job = make_job()
    with session_factory.begin() as session:
        store_workers.register(session, row("w@n", ["default"]))
        store_workers.register(session, row("other@n", ["default"]))
        leases.claim_job(session, job.id, "w@n/1", "n", None, LEASE_S, worker_name="w@n")
    with session_factory() as session:
        views = {v.row.name: v for v in store_workers.list_workers(session, LEASE_S)}
    assert (views["w@n"].state, views["w@n"].current_job) == ("busy", job.id)
    assert (views["other@n"].state, views["other@n"].current_job) == ("idle", None)


def test_queue_offers_count_the_workers_seen_within_the_grace_period(
    session_factory: sessionmaker[Session],
) -> None:
    now = utcnow()
    with session_factory.begin() as session:
        store_workers.register(session, row("a@n", ["a100", "default"], gpus=2,
                                            models=["mlp", "resnet18"]), now=now)
        store_workers.register(session, row("b@n", ["a100"], gpus=8, datasets=["cifar10"]), now=now)
        store_workers.register(session, row("old@n", ["k80"], gpus=1),
                               now=now - timedelta(days=2))
    with session_factory() as session:
        offers = store_workers.queue_offers(session, seen_since=now - timedelta(days=1))
    assert set(offers) == {"a100", "default"}  # k80's only worker was last seen 2 days ago
    assert offers["a100"].workers == 2 and offers["a100"].max_gpus == 8
    assert offers["a100"].models == {"mlp", "resnet18"}
    assert offers["a100"].datasets == {"digits", "cifar10"}
    assert offers["default"].max_gpus == 2
