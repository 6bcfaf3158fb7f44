"""The reaper settles a gang whose members died while it formed: past ACCUM_GANG_FORM_TIMEOUT_S
it is released (fewer than min_nodes joined) so the queue can form its next gang."""

from __future__ import annotations

import time
from collections.abc import Callable

from job_specs import TINY_SPEC

from services.housekeeping.reaper import settle_gangs_once
from services.jobdb.gangs import Member, join_gang, members_of
from services.jobdb.sessions import session_factory
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
