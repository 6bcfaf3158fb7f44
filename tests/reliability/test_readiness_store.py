"""`/readyz` and the artifact store (the S3 test server; PostgreSQL or SQLite, Redis): an outage
shows within a probe period and its end as quickly, every answer comes in under a second
whatever the store does (down, or hanging: accepting connections and never answering), and
an answer without an admin's token says only ok or failing: no endpoint, no bucket."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.api.main import create_app
from services.jobdb import tokens
from services.settings import Settings
from tests.s3_server import BUCKET

ANSWER_WITHIN_S = 1.0
TTL_S = 5.0  # ACCUM_STORE_PROBE_TTL_S's default


@pytest.fixture
def black_hole() -> Iterator[str]:
    """An endpoint that accepts connections (the kernel's backlog) and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


def poll_until(client: TestClient, want: int, headers: dict[str, str], timeout_s: float,
               answers: list[float]) -> tuple[float, Any]:
    """Ask /readyz every 0.2 s until it answers ``want``: (seconds it took, last response);
    each answer's duration is appended to ``answers``."""
    started = time.monotonic()
    while True:
        asked = time.monotonic()
        response = client.get("/readyz", headers=headers)
        answers.append(time.monotonic() - asked)
        if response.status_code == want or time.monotonic() - started > timeout_s:
            return time.monotonic() - started, response
        time.sleep(0.2)


@pytest.mark.slow
def test_readyz_follows_the_store_and_answers_in_under_a_second(
    store_settings: Settings, redis_url: str, s3_url: str, s3_server: Any, black_hole: str,
    monkeypatch: pytest.MonkeyPatch, record_figure: Callable[..., None],
) -> None:
    settings = store_settings.model_copy(update={"broker_url": redis_url, "artifacts_url": s3_url})
    answers: list[float] = []
    with TestClient(create_app(settings, run_reaper=False), raise_server_exceptions=False) as client:
        with client.app.state.session_factory.begin() as session:  # type: ignore[attr-defined]
            _, token = tokens.create_owner_with_token(session, "readiness-admin", admin=True)
        admin = {"Authorization": f"Bearer {token}"}
        _, ready = poll_until(client, 200, {}, 10, answers)
        assert ready.status_code == 200, ready.text
        s3_server.stop()
        try:
            shown_s, down = poll_until(client, 503, {}, 30, answers)
            assert down.status_code == 503, "a store outage never showed"
            why = client.get("/readyz", headers=admin)
        finally:
            s3_server.start()
        recovered_s, ready = poll_until(client, 200, {}, 30, answers)
        assert ready.status_code == 200, f"still {ready.status_code} {recovered_s:.1f} s after recovery"

    assert down.json()["down"] == {"artifacts": "failing"} and down.json()["database"] == "ok"
    for secret in (BUCKET, s3_server.endpoint, f":{s3_server.port}"):
        assert secret not in down.text, down.text
    assert BUCKET in why.json()["detail"]  # the admin is told which store, and why

    monkeypatch.setenv("AWS_ENDPOINT_URL", black_hole)  # read when the app opens its store
    hung: list[float] = []
    with TestClient(create_app(settings, run_reaper=False), raise_server_exceptions=False) as client:
        started = time.monotonic()  # 503 at once ("not probed yet"), then the probe's verdict
        while time.monotonic() - started < 30:
            _, hanging = poll_until(client, 503, admin, 0, hung)
            if "no answer within" in hanging.json().get("detail", ""):
                break
        hung_shown_s = time.monotonic() - started
    assert "no answer within" in hanging.json()["detail"], hanging.text
    slowest, slowest_hung = max(answers), max(hung)
    record_figure(
        "readyz_store",
        area="fault",
        check=f"/readyz with the S3 store stopped and restarted, then hanging (probe every {TTL_S:g} s "
              "in the background); answers without a token",
        figure=f"outage shown after {shown_s:.1f} s, recovery after {recovered_s:.1f} s; hung store "
               f"reported as not answering after {hung_shown_s:.1f} s; slowest answer {slowest:.2f} s (store down), "
               f"{slowest_hung:.2f} s (hung); no endpoint or bucket without an admin token",
        passed=max(slowest, slowest_hung) < ANSWER_WITHIN_S and shown_s <= TTL_S + 4
        and recovered_s <= TTL_S + 2,
    )
    assert max(slowest, slowest_hung) < ANSWER_WITHIN_S, (answers, hung)
    assert shown_s <= TTL_S + 4 and recovered_s <= TTL_S + 2, (shown_s, recovered_s)
