"""Streams of one job share their database poll (services/api/sse.py, ``shared_poll``): at one
tick, streams that have sent the same things get the same messages from one read; a stream
in another state, or at the next tick, reads for itself."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from services.api import sse
from services.jobdb import leases, metrics
from services.jobdb.models import Job


class CountingSessions:
    """A session factory that counts the sessions (database polls) opened through it."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory, self.opened = factory, 0

    def __call__(self) -> Session:
        self.opened += 1
        return self.factory()


def write_steps(session_factory: sessionmaker[Session], job_id: str, steps: range) -> None:
    with session_factory.begin() as session:
        metrics.write_metrics(session, job_id, 1, [{"name": "loss", "step": s, "value": 1.0} for s in steps])


def test_streams_in_the_same_state_share_one_poll_per_tick(
    submitted: dict[str, Any], session_factory: sessionmaker[Session]
) -> None:
    job_id = submitted["id"]
    with session_factory.begin() as session:
        leases.claim_job(session, job_id, "w1", "h", None, lease_timeout_s=60)
    write_steps(session_factory, job_id, range(1, 4))
    with session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        states = [sse.open_stream(session, job) for _ in range(3)]
    states[2].metric_steps = {"loss": 2}  # this one has sent more already
    sessions = CountingSessions(session_factory)
    shared: Any = sessions

    answers = [sse.shared_poll(shared, job_id, state, tick=1) for state in states]

    assert sessions.opened == 2  # one read for the two streams in step, one for the other
    assert answers[0] == answers[1]
    assert [s.metric_steps for s in states] == [{"loss": 3}] * 3
    # Next tick: a new read, whose new step reaches every stream once.
    write_steps(session_factory, job_id, range(4, 5))
    later = [sse.shared_poll(shared, job_id, state, tick=2) for state in states]
    assert sessions.opened == 3
    metric_lines = [[m for m in messages if m.startswith(b"event: metric")] for messages, _ in later]
    assert [len(lines) for lines in metric_lines] == [1, 1, 1]
    assert all(b'"step":4' in lines[0] for lines in metric_lines)
