"""Live streams over a real server (services/api/streams.py): at most
ACCUM_MAX_STREAMS_PER_OWNER open per owner (429 beyond, a slot freed when one closes), and an
open stream closes once its token is revoked (issue 15: 1,500 streams from one token were
accepted, and a stream opened before `accum token revoke` kept delivering events).

    .venv/bin/python -m pytest tests/reliability/test_streams.py -q
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import httpx
import pytest
from api.conftest import api_settings  # noqa: F401  (fixture)
from api.test_server import next_of, read_stream, serve
from job_specs import MINIMAL_SPEC
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import tokens
from services.settings import Settings


def owner_token(session_factory: sessionmaker[Session], name: str) -> dict[str, str]:
    with session_factory.begin() as session:
        _, token = tokens.create_owner_with_token(session, name)
    return {"Authorization": f"Bearer {token}"}


def open_stream(url: str, headers: dict[str, str]) -> queue.Queue[tuple[str, dict[str, Any]]]:
    messages: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
    threading.Thread(target=read_stream, args=(url, headers, messages), daemon=True).start()
    assert next_of(messages, "status")["status"] == "queued"  # open and counted
    return messages


@pytest.mark.slow
def test_streams_past_the_cap_get_429_and_a_closed_one_frees_its_slot(
    api_settings: Settings,  # noqa: F811
    session_factory: sessionmaker[Session],
    record_figure: Any,
) -> None:
    alice, bob = owner_token(session_factory, "alice"), owner_token(session_factory, "bob")
    with serve(api_settings, max_streams_per_owner="2") as server:
        job = httpx.post(f"{server}/v1/jobs", json=MINIMAL_SPEC, headers=alice, timeout=10).json()
        url = f"{server}/v1/jobs/{job['id']}/events"
        stream = {"Accept": "text/event-stream"}
        first = httpx.Client(timeout=30)
        with first.stream("GET", url, headers={**alice, **stream}) as held:
            assert held.status_code == 200
            open_stream(url, alice)
            refused = httpx.get(url, headers={**alice, **stream}, timeout=10)
            assert refused.status_code == 429
            problem = refused.json()
            assert problem["max_streams"] == 2 and problem["open_streams"] == 2
            assert "ACCUM_MAX_STREAMS_PER_OWNER" in problem["detail"]
            assert "Retry-After" in refused.headers
            # Another owner is not affected, nor is the plain JSON list.
            other = httpx.get(f"{server}/v1/jobs/{job['id']}/events", headers=alice, timeout=10)
            assert other.status_code == 200
            assert httpx.get(url, headers={**bob, **stream}, timeout=10).status_code == 404
        first.close()
        # The closed stream's slot is free again (the server notices the disconnect at its
        # next write or poll, so ask until it has).
        deadline = time.monotonic() + 15
        while True:
            with httpx.stream("GET", url, headers={**alice, **stream}, timeout=10) as again:
                if again.status_code == 200 or time.monotonic() > deadline:
                    break
            time.sleep(0.05)
        assert again.status_code == 200
    record_figure(
        "stream_cap", area="limits",
        check="ACCUM_MAX_STREAMS_PER_OWNER=2 on a real server: a third live stream of one owner, "
        "another owner's, the plain event list; then one stream closed",
        figure=f"third stream: {refused.status_code} naming max_streams {problem['max_streams']} "
        f"and open_streams {problem['open_streams']}; plain list {other.status_code}; after a "
        f"close the next stream: {again.status_code}",
        passed=refused.status_code == 429 and again.status_code == 200,
    )


def test_an_open_stream_closes_once_its_token_is_revoked(
    api_settings: Settings,  # noqa: F811
    session_factory: sessionmaker[Session],
    record_figure: Any,
) -> None:
    alice = owner_token(session_factory, "alice")
    token = alice["Authorization"].removeprefix("Bearer ")
    with serve(api_settings, stream_token_recheck_s="0.5") as server:
        job = httpx.post(f"{server}/v1/jobs", json=MINIMAL_SPEC, headers=alice, timeout=10).json()
        messages = open_stream(f"{server}/v1/jobs/{job['id']}/events", alice)
        with session_factory.begin() as session:
            assert tokens.revoke_token(session, token) == 1
        revoked_at = time.monotonic()
        error = next_of(messages, "error")
        closed = messages.get(timeout=15)[0]
        after_s = time.monotonic() - revoked_at
    assert error["status"] == 401 and "revoked" in error["detail"]
    assert closed == "closed"
    record_figure(
        "stream_revoked", area="auth",
        check="a live event stream open on a real server (token re-checked every 0.5 s here, "
        "10 s by default) when its token is revoked",
        figure=f"event: error with status {error['status']} and the stream closed "
        f"{after_s:.1f} s after the revoke",
        passed=error["status"] == 401 and closed == "closed",
    )
