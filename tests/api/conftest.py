"""API test fixtures: the real app over a migrated store (SQLite and PostgreSQL), and tokens.

Every test that asks for `client` runs twice, once per backend. Jobs are enqueued on the
embedded SQLite broker under `accum_home` (no worker consumes them), so tests can count the
messages the API sent.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from job_specs import MINIMAL_SPEC
from sqlalchemy.orm import Session, sessionmaker

from services.api.main import create_app
from services.jobdb import tokens
from services.settings import Settings


@pytest.fixture
def api_settings(store_settings: Settings) -> Settings:
    """The store's settings with the embedded broker in the test's home, whatever
    ACCUM_BROKER_URL the environment has (tests count the messages in it), and no practical
    limit on failed token checks."""
    broker = Path(store_settings.home) / "broker.sqlite"
    # Tests send bad tokens in bulk from one address; the limiter has its own tests
    # (tests/api/test_auth_failures.py, tests/reliability/test_limits.py).
    return store_settings.model_copy(
        update={"broker_url": f"sqlite:///{broker}", "auth_failures_per_window": 1_000_000}
    )


@pytest.fixture
def app(api_settings: Settings) -> FastAPI:
    # The reaper thread has its own test (test_main.py); here it would only add noise.
    return create_app(api_settings, run_reaper=False)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def _token(session_factory: sessionmaker[Session], name: str, admin: bool = False) -> str:
    with session_factory.begin() as session:
        _, token = tokens.create_owner_with_token(session, name, admin=admin)
    return token


@pytest.fixture
def alice(session_factory: sessionmaker[Session]) -> dict[str, str]:
    """Headers of owner alice."""
    return {"Authorization": f"Bearer {_token(session_factory, 'alice')}"}


@pytest.fixture
def bob(session_factory: sessionmaker[Session]) -> dict[str, str]:
    """Headers of owner bob (who must never see alice's jobs)."""
    return {"Authorization": f"Bearer {_token(session_factory, 'bob')}"}


@pytest.fixture
def admin(session_factory: sessionmaker[Session]) -> dict[str, str]:
    return {"Authorization": f"Bearer {_token(session_factory, 'root', admin=True)}"}


@pytest.fixture
def spec() -> dict[str, Any]:
    return {**MINIMAL_SPEC, "optimizer": dict(MINIMAL_SPEC["optimizer"])}


@pytest.fixture
def submitted(client: TestClient, alice: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    """A job alice submitted (queued)."""
    response = client.post("/v1/jobs", json=spec, headers=alice)
    assert response.status_code == 201, response.text
    return dict(response.json())


@pytest.fixture
def broker_messages(api_settings: Settings) -> Any:
    """`broker_messages()` -> job ids the API put on the embedded broker, in order."""

    def read() -> list[str]:
        path = Path(api_settings.broker_url.removeprefix("sqlite:///"))
        if not path.exists():
            return []
        with sqlite3.connect(path) as conn:
            try:
                rows = conn.execute("SELECT payload FROM broker_messages ORDER BY id").fetchall()
            except sqlite3.OperationalError:  # the transport is creating its table right now
                return []
        return [_job_id_of(payload) for (payload,) in rows]

    return read


def _job_id_of(payload: str) -> str:
    import json

    message = json.loads(payload)
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        import base64

        body = base64.b64decode(body).decode()
    args = json.loads(body)[0]
    return str(args[0])
