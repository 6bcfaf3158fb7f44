"""Checkpoints over HTTP: the list, and the file with ETag = sha256 (304 on If-None-Match,
404 when the row or the file is missing)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.settings import Settings
from services.store import checkpoints


@pytest.fixture
def checkpoint_file(
    api_settings: Settings, session_factory: sessionmaker[Session], submitted: dict[str, Any]
) -> tuple[Path, bytes]:
    """A small checkpoint at step 10 written like the worker does: the file, then its row."""
    content = b"not really torch.save output, but bytes all the same" * 100
    path = api_settings.artifacts_path / submitted["id"] / "10.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with session_factory.begin() as session:
        checkpoints.add_checkpoint(
            session,
            submitted["id"],
            step=10,
            uri=str(path),
            size_bytes=len(content),
            sha256=hashlib.sha256(content).hexdigest(),
            epoch=1,
            metrics={"val_loss": 0.5},
        )
    return path, content


def test_list_shows_step_size_hash_and_metrics(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], checkpoint_file: tuple[Path, bytes]
) -> None:
    _, content = checkpoint_file

    items = client.get(f"/v1/jobs/{submitted['id']}/checkpoints", headers=alice).json()["items"]

    assert len(items) == 1
    item = items[0]
    assert (item["step"], item["epoch"], item["size_bytes"]) == (10, 1, len(content))
    assert item["sha256"] == hashlib.sha256(content).hexdigest()
    assert item["metrics"] == {"val_loss": 0.5} and item["created_at"]


def test_download_streams_the_file_with_its_sha256_as_etag(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], checkpoint_file: tuple[Path, bytes]
) -> None:
    _, content = checkpoint_file
    digest = hashlib.sha256(content).hexdigest()

    response = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/10", headers=alice)

    assert response.status_code == 200
    assert response.content == content
    assert response.headers["ETag"] == f'"{digest}"'
    assert response.headers["content-type"] == "application/octet-stream"
    assert f"{submitted['id']}-10.pt" in response.headers["content-disposition"]


def test_if_none_match_with_the_etag_is_304(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], checkpoint_file: tuple[Path, bytes]
) -> None:
    url = f"/v1/jobs/{submitted['id']}/checkpoints/10"
    etag = client.get(url, headers=alice).headers["ETag"]

    cached = client.get(url, headers={**alice, "If-None-Match": etag})
    stale = client.get(url, headers={**alice, "If-None-Match": '"0000"'})

    assert cached.status_code == 304 and cached.content == b""
    assert cached.headers["ETag"] == etag
    assert stale.status_code == 200


def test_missing_step_or_missing_file_is_404(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], checkpoint_file: tuple[Path, bytes]
) -> None:
    path, _ = checkpoint_file
    no_row = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/11", headers=alice)
    path.unlink()
    no_file = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/10", headers=alice)

    assert no_row.status_code == 404 and "no checkpoint at step 11" in no_row.json()["detail"]
    assert no_file.status_code == 404 and "gone" in no_file.json()["detail"]


def test_non_integer_step_is_422(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any]
) -> None:
    response = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/latest", headers=alice)

    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == "path.step"
