"""Health probes: /healthz always, /readyz only when the database, the broker and the artifact
store answer (503 problem+json naming what is failing; why, with hosts and paths, for admins)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from services.api.main import create_app
from services.settings import Settings

from ..helpers import PROBLEM_JSON

# Nothing listens on port 1: connections are refused at once, as for a stopped service.
DEAD_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:1/accum"
DEAD_REDIS = "redis://127.0.0.1:1/0"


def test_healthz_and_readyz_when_everything_is_up(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")

    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "ready"


def test_readyz_with_redis_broker_up(store_settings: Settings, redis_url: str) -> None:
    settings = store_settings.model_copy(update={"broker_url": redis_url})
    with TestClient(create_app(settings, run_reaper=False)) as client:
        assert client.get("/readyz").status_code == 200


@pytest.mark.parametrize(
    ("changes", "down", "up"),
    [
        ({"broker_url": DEAD_REDIS}, "broker", "database"),
        ({"database_url": DEAD_POSTGRES}, "database", "broker"),
    ],
)
def test_readyz_is_503_naming_what_is_down(
    api_settings: Settings, changes: dict[str, str], down: str, up: str
) -> None:
    settings = api_settings.model_copy(update=changes)
    with TestClient(create_app(settings, run_reaper=False), raise_server_exceptions=False) as client:
        start = time.monotonic()
        response = client.get("/readyz")
        elapsed = time.monotonic() - start
        alive = client.get("/healthz")

    assert response.status_code == 503
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body = response.json()
    assert f"{down} failing" in body["detail"] and up not in body["detail"]
    assert body["down"] == {down: "failing"} and body[down] == "failing" and body[up] == "ok"
    assert "127.0.0.1" not in response.text and ":1" not in response.text  # no host, no port
    assert elapsed < 5  # short timeouts: a probe must not hang
    assert alive.status_code == 200  # alive, just not ready


def test_readyz_tells_an_admin_why(
    api_settings: Settings, admin: dict[str, str], alice: dict[str, str]
) -> None:
    settings = api_settings.model_copy(update={"broker_url": DEAD_REDIS})
    with TestClient(create_app(settings, run_reaper=False), raise_server_exceptions=False) as client:
        for_admin = client.get("/readyz", headers=admin)
        for_owner = client.get("/readyz", headers=alice)
    assert for_admin.status_code == for_owner.status_code == 503
    assert "broker unreachable" in for_admin.json()["detail"] and "127.0.0.1:1" in for_admin.text
    assert "127.0.0.1" not in for_owner.text and for_owner.json()["down"] == {"broker": "failing"}


def test_readyz_probes_the_artifact_store_and_caches_the_answer(
    api_settings: Settings, tmp_path: Path, admin: dict[str, str]
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store's directory should be")
    settings = api_settings.model_copy(
        update={"artifacts_url": (blocker / "artifacts").as_uri(), "store_probe_ttl_s": 3600})
    app = create_app(settings, run_reaper=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        down = client.get("/readyz", headers=admin)
        assert down.status_code == 503 and list(down.json()["down"]) == ["artifacts"]
        assert str(blocker / "artifacts") in down.json()["detail"]  # which store, and why (admins)
        blocker.unlink()  # fixed: the store works now, but the cached answer holds
        assert client.get("/readyz").status_code == 503
        app.state.store_probe.ttl_s = 0
        ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["artifacts"] == "ok"
    assert app.state.store_probe.failures == 1
    assert list((blocker.parent / "not-a-directory" / "artifacts").rglob("*")) == [
        blocker / "artifacts" / "_probe"]  # the probe object itself was deleted
