"""Limits: the per-owner cap on unfinished jobs, the request body size, failed token checks.

    .venv/bin/python -m pytest tests/reliability/test_limits.py -q

- cap: past ACCUM_MAX_ACTIVE_JOBS_PER_OWNER a submit (or resume) is 429 problem+json naming
  the cap and the active count, and nothing of it is stored or enqueued; concurrent submits
  never overshoot (PostgreSQL: per-owner advisory lock; SQLite: its single writer).
- body: a 10 MB body gets 413 from a real server before it is read, declared or chunked.
- failed tokens: after ACCUM_AUTH_FAILURES_PER_WINDOW bad tokens from an address, or for one
  token prefix (from any address, forwarded or not), a bad token gets 429 with Retry-After;
  a valid token never does.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from api.conftest import alice, api_settings, bob, broker_messages, spec  # noqa: F401  (fixtures)
from api.helpers import PROBLEM_JSON, jobs_stored
from api_process import running_api
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.api.main import create_app
from services.jobdb.models import Owner
from services.jobdb.quotas import count_active_jobs
from services.settings import Settings

CAP = 5
CONCURRENT_SUBMITS = 24
TEN_MB = 10 * 1000 * 1000


def capped_client(api_settings: Settings, **limits: Any) -> TestClient:  # noqa: F811
    app = create_app(api_settings.model_copy(update=limits), run_reaper=False)
    return TestClient(app, raise_server_exceptions=False)


def test_owner_cap_refuses_past_the_limit_stores_nothing_and_holds_under_concurrency(
    api_settings: Settings,  # noqa: F811
    alice: dict[str, str],  # noqa: F811
    bob: dict[str, str],  # noqa: F811
    spec: dict[str, Any],  # noqa: F811
    session_factory: sessionmaker[Session],
    broker_messages: Callable[[], list[str]],  # noqa: F811
    record_figure: Any,
    database_backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with capped_client(api_settings, max_active_jobs_per_owner=CAP) as client:
        ids = [client.post("/v1/jobs", json=spec, headers=alice).json()["id"] for _ in range(CAP)]
        stored, sent = jobs_stored(session_factory), len(broker_messages())

        refused = client.post("/v1/jobs", json=spec, headers=alice)

        assert refused.status_code == 429, refused.text
        assert refused.headers["content-type"].startswith(PROBLEM_JSON)
        problem = refused.json()
        assert (problem["max_active_jobs"], problem["active_jobs"]) == (CAP, CAP)
        assert f"limit per owner is {CAP}" in problem["detail"] and "accum cancel" in problem["detail"]
        assert (jobs_stored(session_factory), len(broker_messages())) == (stored, sent)
        # Another owner is not affected; a finished job frees a place.
        assert client.post("/v1/jobs", json=spec, headers=bob).status_code == 201
        assert client.post(f"/v1/jobs/{ids[0]}/cancel", headers=alice).status_code == 202
        assert client.post("/v1/jobs", json=spec, headers=alice).status_code == 201
        # Resuming the cancelled job would make CAP + 1 unfinished jobs: refused, unchanged.
        resumed = client.post(f"/v1/jobs/{ids[0]}/resume", headers=alice)
        assert resumed.status_code == 429, resumed.text
        assert client.get(f"/v1/jobs/{ids[0]}", headers=alice).json()["status"] == "cancelled"

        # Concurrency: a fresh owner, CONCURRENT_SUBMITS submits at once (see _racing_submits).
        outcomes = _racing_submits(session_factory, monkeypatch, spec, CONCURRENT_SUBMITS)

    created, capped = outcomes.count("created"), outcomes.count("capped")
    with session_factory() as session:
        carol_id = session.scalar(select(Owner.id).where(Owner.name == "carol"))
        assert carol_id is not None
        carol_active = count_active_jobs(session, carol_id)
    assert (created, capped) == (CAP, CONCURRENT_SUBMITS - CAP), outcomes
    assert carol_active == CAP
    record_figure(
        "owner_job_cap",
        area="limits",
        check=f"cap {CAP} unfinished jobs per owner ({database_backend}): one submit past it, "
        f"then {CONCURRENT_SUBMITS} concurrent submits by a new owner, held between writing "
        "the job and checking the cap until all have written",
        figure=f"past the cap: 429 naming cap {problem['max_active_jobs']} and "
        f"{problem['active_jobs']} active, 0 rows and 0 broker messages added; concurrent: "
        f"{created} created, {capped} refused, {carol_active - CAP} over the cap",
        passed=carol_active == CAP,
    )


def _racing_submits(
    session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    body: dict[str, Any],
    n: int,
) -> list[str]:
    """`n` threads submit for a new owner "carol" (store.jobs.create_job, as the route does),
    each stopped after writing its job until all have written (or 2 s: SQLite's single
    writer lets only one write at a time) and only then checking the cap: the worst
    interleaving, forced. Returns "created" or "capped" per thread."""
    from services.jobdb import jobs
    from services.jobdb.errors import ActiveJobCapReached
    from services.jobdb.tokens import create_owner_with_token
    from services.spec import parse_spec

    with session_factory.begin() as session:
        carol, _ = create_owner_with_token(session, "carol")
    normalised = parse_spec(body).normalised()
    barrier = threading.Barrier(n)
    confirm = jobs.confirm_under_cap

    def confirm_when_all_have_written(*args: Any) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=2)
        confirm(*args)

    monkeypatch.setattr(jobs, "confirm_under_cap", confirm_when_all_have_written)
    outcomes: list[str] = []

    def submit() -> None:
        try:
            with session_factory.begin() as session:
                jobs.create_job(session, owner=carol, spec=normalised, max_active_jobs=CAP)
            outcomes.append("created")
        except ActiveJobCapReached:
            outcomes.append("capped")

    threads = [threading.Thread(target=submit) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return outcomes


def _send_big_body(url: str, token: str, chunked: bool) -> tuple[int, int]:
    """POST a 10 MB body to /v1/jobs over a raw socket, 64 KiB at a time, stopping once the
    server has answered; returns (status, bytes of body sent before the answer came)."""
    host, port = url.removeprefix("http://").split(":")
    head = f"POST /v1/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
    head += "Content-Type: application/json\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {TEN_MB}\r\n\r\n"
    piece = b" " * 65536
    sent = 0
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        sock.settimeout(0.05)
        answer = b""
        while sent < TEN_MB and not answer:
            try:
                answer = sock.recv(65536)
                break
            except TimeoutError:
                pass
            chunk = piece[: TEN_MB - sent]
            try:
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk)
            except OSError:  # the server closed the connection after answering
                break
            sent += len(chunk)
        sock.settimeout(30)
        while b"\r\n" not in answer:
            answer += sock.recv(65536)
    return int(answer.split()[1]), sent


def test_a_10_mb_body_is_refused_before_it_is_read(
    api_settings: Settings,  # noqa: F811
    alice: dict[str, str],  # noqa: F811
    session_factory: sessionmaker[Session],
    tmp_path: Path,
    record_figure: Any,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCUM_")}
    env |= {
        "ACCUM_HOME": str(api_settings.home),
        "ACCUM_DATABASE_URL": api_settings.database_url,
        "ACCUM_BROKER_URL": api_settings.broker_url,
    }
    token = alice["Authorization"].removeprefix("Bearer ")
    limit = api_settings.max_body_bytes
    with running_api(env, tmp_path / "api.log") as api:
        declared, declared_sent = _send_big_body(api.url, token, chunked=False)
        chunked, chunked_sent = _send_big_body(api.url, token, chunked=True)

    assert (declared, chunked) == (413, 413)
    assert declared_sent < TEN_MB and chunked_sent < TEN_MB
    assert jobs_stored(session_factory) == 0
    record_figure(
        "body_limit",
        area="limits",
        check=f"POST /v1/jobs with a 10 MB body to a real server (limit {limit} bytes), "
        "with Content-Length and chunked",
        figure=f"413 both; body bytes sent before the answer: {declared_sent:,} with "
        f"Content-Length, {chunked_sent:,} chunked (of {TEN_MB:,}); 0 jobs stored",
        passed=declared == chunked == 413 and declared_sent < TEN_MB and chunked_sent < TEN_MB,
    )


def test_bad_tokens_are_limited_per_address_and_per_prefix_and_valid_tokens_never_are(
    api_settings: Settings,  # noqa: F811
    alice: dict[str, str],  # noqa: F811
    record_figure: Any,
) -> None:
    """Issue 15: one address sending bad tokens (a NAT, a proxy) must not lock out the valid
    users behind it, and guesses at one token's prefix are limited from every address."""
    defaults = Settings(home=api_settings.home)  # the shipped limits, not the tests' relaxed ones
    limit, window = defaults.auth_failures_per_window, defaults.auth_failure_window_s
    proxy = "192.0.2.10"  # trusted: its X-Forwarded-For names the client
    app = create_app(
        api_settings.model_copy(
            update={
                "auth_failures_per_window": limit,
                "auth_failure_window_s": window,
                "forwarded_allow_ips": proxy,
            }
        ),
        run_reaper=False,
    )

    def guess(i: int) -> dict[str, str]:  # a different prefix every time
        return {"Authorization": f"Bearer accum_{i:06d}-wrong"}

    alice_prefix = alice["Authorization"].removeprefix("Bearer ")[:12]
    with (
        TestClient(app, client=("203.0.113.7", 40000)) as guesser,
        TestClient(app, client=("198.51.100.2", 40000)) as neighbour,
        TestClient(app, client=(proxy, 40000)) as behind_proxy,
    ):
        started = time.monotonic()
        failures = [guesser.get("/v1/jobs", headers=guess(i)).status_code for i in range(limit)]
        blocked = guesser.get("/v1/jobs", headers=guess(limit))
        elapsed = time.monotonic() - started
        valid_same_address = guesser.get("/v1/jobs", headers=alice)
        other_bad = neighbour.get("/v1/jobs", headers=guess(limit + 1))
        # Guesses at alice's prefix, each from a new address (a changing X-Forwarded-For
        # through the trusted proxy): the prefix's count stops them, not the addresses'.
        targeted = [
            behind_proxy.get(
                "/v1/jobs",
                headers={
                    "Authorization": f"Bearer {alice_prefix}wrong{i}",
                    "X-Forwarded-For": f"100.64.0.{i}",
                },
            ).status_code
            for i in range(limit + 1)
        ]
        valid_targeted = neighbour.get("/v1/jobs", headers=alice)

    assert failures == [401] * limit
    assert blocked.status_code == 429 and blocked.headers["content-type"].startswith(PROBLEM_JSON)
    retry_after = int(blocked.headers["Retry-After"])
    assert window - elapsed - 1 <= retry_after <= window
    assert blocked.json()["retry_after_s"] == retry_after
    assert valid_same_address.status_code == 200  # never the bad-token 429
    assert other_bad.status_code == 401
    assert targeted == [401] * limit + [429]
    assert valid_targeted.status_code == 200
    record_figure(
        "auth_rate_limit",
        area="limits",
        check=f"{limit + 1} bad tokens from one address (defaults: {limit} failures per "
        f"{window:g} s), then a valid token from it; {limit + 1} guesses at one token's prefix "
        "from as many forwarded addresses, then that valid token",
        figure=f"first {failures.count(401)} -> 401, then 429 with Retry-After {retry_after} s; "
        f"valid token from that address: {valid_same_address.status_code}; another address's "
        f"bad token: {other_bad.status_code}; prefix guesses: {targeted.count(401)} x 401 then "
        f"{targeted[-1]}; the valid token: {valid_targeted.status_code}",
        passed=blocked.status_code == 429
        and valid_same_address.status_code == valid_targeted.status_code == 200
        and targeted[-1] == 429,
    )
