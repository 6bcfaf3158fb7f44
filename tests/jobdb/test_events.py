"""Job events: appended in order, read after an id (the SSE stream polls this way)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import events
from services.jobdb.models import Job


def test_events_are_read_in_order_after_an_id(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job, other = make_job(seed=1), make_job(seed=2)
    with session_factory.begin() as session:
        for i in range(5):
            events.add_event(
                session, job.id, "oom_backoff", f"halved to {2**i}", {"micro": 2**i}, attempt=1
            )
        events.add_event(session, other.id, "checkpoint", "step 1")
    with session_factory() as session:
        everything = events.list_events(session, job.id)
        assert [e.kind for e in everything] == ["created"] + ["oom_backoff"] * 5
        assert [e.id for e in everything] == sorted(e.id for e in everything)
        after = events.list_events(session, job.id, after_id=everything[2].id, limit=2)
        assert [e.message for e in after] == ["halved to 4", "halved to 8"]
        assert after[0].data == {"micro": 4} and after[0].attempt == 1
        assert after[0].created_at.tzinfo is not None
        assert events.list_events(session, job.id, after_id=everything[-1].id) == []
        with pytest.raises(ValueError, match="limit"):
            events.list_events(session, job.id, limit=0)
