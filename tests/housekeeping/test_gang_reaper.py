"""The reaper settles a gang whose members died while it formed: past ACCUM_GANG_FORM_TIMEOUT_S
it is released (fewer than min_nodes joined) so the queue can form its next gang; and a worker's
reaper ends the lease of a running gang whose node 0's worker is gone."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from datetime import timedelta

from job_specs import TINY_SPEC
from worker_rows import worker_row

from services.housekeeping.reaper import end_dead_leaders_once, settle_gangs_once
from services.jobdb import workers as store_workers
from services.jobdb.events import list_events
from services.jobdb.gangs import Member, join_gang, members_of, record_endpoint
from services.jobdb.models import Job
from services.jobdb.sessions import session_factory
from services.jobdb.types import utcnow
from services.settings import Settings


def test_a_gang_nobody_polls_is_released_past_the_timeout(
    settings: Settings, make_job: Callable[..., str],
) -> None:
    job_id = make_job({**TINY_SPEC, "nodes": 2, "min_nodes": 2}, queue="gangs")
    with session_factory(settings).begin() as session:
        assert join_gang(session, job_id, Member("dead@n1", "dead/1"), lease_timeout_s=2) is not None
    timeout = settings.gang_form_timeout_s
    assert settle_gangs_once(settings, clock=lambda: time.time() + timeout - 5) == {}
    assert settle_gangs_once(settings, clock=lambda: time.time() + timeout + 1,
                             queues=["other"]) == {}  # a worker of another queue leaves it
    assert settle_gangs_once(settings, clock=lambda: time.time() + timeout + 1) == {"gangs": "released"}
    with session_factory(settings)() as session:
        assert members_of(session, job_id) == []


def test_a_worker_s_reaper_ends_a_dead_node_0_s_lease_once_its_store_refuses(
    settings: Settings, make_job: Callable[..., str],
) -> None:
    """Issue 40: node 0's worker gone (its lease and registry row unrenewed for three beats,
    its rendezvous store refusing connections): a worker's reaper ends the lease now and
    re-queues the job, rather than after ACCUM_LEASE_TIMEOUT_S. A store that still accepts
    (a frozen process) keeps it; the API's reaper (every queue) leaves it to the lease."""
    own = settings.model_copy(update={"lease_timeout_s": 60.0, "heartbeat_interval_s": 2.0})
    job_id = make_job({**TINY_SPEC, "nodes": 2, "min_nodes": 1}, queue="gangs")
    silent_since = utcnow() - timedelta(seconds=10)  # node 0's last renewal: 10 s > 3 beats
    with session_factory(own).begin() as session:
        store_workers.register(session, worker_row("lead@n0", ["gangs"]), now=silent_since)
        for name in ("lead@n0", "follow@n1"):
            assert join_gang(session, job_id, Member(name, f"{name}/1"), lease_timeout_s=own.lease_timeout_s,
                             now=silent_since) is not None
    with socket.create_server(("127.0.0.1", 0)) as store:  # node 0's store still accepts
        port = store.getsockname()[1]
        with session_factory(own).begin() as session:
            record_endpoint(session, job_id, 1, "127.0.0.1", port, "s" * 32)
        assert end_dead_leaders_once(own, queues=["gangs"]) == []
    assert end_dead_leaders_once(own, queues=None) == []  # the API's reaper
    assert end_dead_leaders_once(own, queues=["gangs"]) == [job_id]  # refused now
    with session_factory(own)() as session:
        job = session.get(Job, job_id)
        assert job is not None and (job.status, job.restarts, job.lease_owner) == ("queued", 1, None)
        kinds = [e.kind for e in list_events(session, job_id, limit=100)]
        assert "leader_lost" in kinds and "lease_expired" in kinds, kinds
