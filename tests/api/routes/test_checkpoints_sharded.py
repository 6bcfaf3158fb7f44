"""A sharded (FSDP) checkpoint over HTTP (a local store and S3): its row holds the manifest's key;
the download serves its consolidated file (ETag = the row's sha256, which is that file's), and
one with shards only answers 409 saying how to get a full file, not a 500 or the manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.artifacts import consolidated_key, manifest_key, open_store
from services.jobdb import checkpoints
from services.settings import Settings

SHARDS = {".metadata": b"m" * 10, "__0_0.distcp": b"a" * 300, "__1_0.distcp": b"b" * 200, "trainer.pt": b"t" * 50}
FULL = b"the consolidated state dict" * 40


@pytest.fixture
def api_settings(api_settings: Settings, artifacts_url: str) -> Settings:
    return api_settings.model_copy(update={"artifacts_url": artifacts_url})


def store_sharded(settings: Settings, sessions: sessionmaker[Session], job_id: str, tmp_path: Path,
                  consolidated: bool) -> str:
    """Step 20 stored like the worker does: every file, the manifest, then the row."""
    store = open_store(settings.artifacts_url)
    key = manifest_key(job_id, 20)
    files: dict[str, dict[str, Any]] = {}
    for name, data in SHARDS.items():
        (tmp_path / name).write_bytes(data)
        store.put(f"{job_id}/20/{name}", tmp_path / name)
        files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "rank": 0}
    full: dict[str, Any] | None = None
    if consolidated:
        (tmp_path / "full.pt").write_bytes(FULL)
        store.put(consolidated_key(key), tmp_path / "full.pt")
        full = {"sha256": hashlib.sha256(FULL).hexdigest(), "size": len(FULL)}
    manifest = json.dumps({"format": 1, "step": 20, "files": files, "consolidated": full}).encode()
    (tmp_path / "manifest.json").write_bytes(manifest)
    store.put(key, tmp_path / "manifest.json")
    size = sum(len(d) for d in SHARDS.values()) + len(manifest) + (len(FULL) if consolidated else 0)
    sha256 = str(full["sha256"]) if full else hashlib.sha256(manifest).hexdigest()
    with sessions.begin() as session:
        checkpoints.add_checkpoint(session, job_id, step=20, key=key, size_bytes=size, sha256=sha256)
    return sha256


def test_the_download_of_a_sharded_checkpoint_is_its_consolidated_file(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], api_settings: Settings,
    session_factory: sessionmaker[Session], tmp_path: Path,
) -> None:
    sha256 = store_sharded(api_settings, session_factory, submitted["id"], tmp_path, consolidated=True)
    response = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/20", headers=alice)
    assert response.status_code == 200, response.text
    assert response.content == FULL and response.headers["ETag"] == f'"{sha256}"'
    listed = client.get(f"/v1/jobs/{submitted['id']}/checkpoints", headers=alice).json()["items"]
    assert listed[0]["sha256"] == hashlib.sha256(response.content).hexdigest()  # what clients check


def test_a_sharded_checkpoint_without_a_consolidated_file_answers_409_with_how_to_get_one(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], api_settings: Settings,
    session_factory: sessionmaker[Session], tmp_path: Path,
) -> None:
    store_sharded(api_settings, session_factory, submitted["id"], tmp_path, consolidated=False)
    response = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/20", headers=alice)
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert "ACCUM_CONSOLIDATE_MAX_BYTES" in detail and "consolidate_checkpoint" in detail
    assert f"{submitted['id']}/20/" in detail and '"step": 20' in detail  # the folder; init_from
