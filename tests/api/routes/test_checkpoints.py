"""Checkpoints over HTTP, streamed from the artifact store (a local directory and S3): the list,
the object with ETag = sha256 (304 on If-None-Match, 206 for a Range, 404 when the row or the
object is missing), a 307 to a presigned URL with ACCUM_DOWNLOAD_REDIRECT=1 on S3, and a job's
deletion."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.artifacts import open_store
from services.jobdb import checkpoints, jobs
from services.settings import Settings


@pytest.fixture
def api_settings(api_settings: Settings, artifacts_url: str) -> Settings:
    return api_settings.model_copy(update={"artifacts_url": artifacts_url})


@pytest.fixture
def checkpoint_file(
    api_settings: Settings, session_factory: sessionmaker[Session], submitted: dict[str, Any],
    tmp_path: Path,
) -> tuple[str, bytes]:
    """A checkpoint at step 10 stored like the worker does: the object, then its row."""
    content = b"not really torch.save output, but bytes all the same" * 100
    source = tmp_path / "10.pt"
    source.write_bytes(content)
    key = f"{submitted['id']}/10.pt"
    open_store(api_settings.artifacts_url).put(key, source)
    with session_factory.begin() as session:
        checkpoints.add_checkpoint(
            session, submitted["id"], step=10, key=key, size_bytes=len(content),
            sha256=hashlib.sha256(content).hexdigest(), epoch=1, metrics={"val_loss": 0.5},
        )
    return key, content


def test_list_shows_step_size_hash_and_metrics(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], checkpoint_file: tuple[str, bytes]
) -> None:
    _, content = checkpoint_file

    items = client.get(f"/v1/jobs/{submitted['id']}/checkpoints", headers=alice).json()["items"]

    assert len(items) == 1
    item = items[0]
    assert (item["step"], item["epoch"], item["size_bytes"]) == (10, 1, len(content))
    assert item["sha256"] == hashlib.sha256(content).hexdigest()
    assert item["metrics"] == {"val_loss": 0.5} and item["created_at"]


def test_download_streams_the_object_with_its_sha256_as_etag(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], checkpoint_file: tuple[str, bytes]
) -> None:
    _, content = checkpoint_file
    digest = hashlib.sha256(content).hexdigest()

    response = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/10", headers=alice)

    assert response.status_code == 200
    assert response.content == content
    assert response.headers["ETag"] == f'"{digest}"'
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-length"] == str(len(content))
    assert f"{submitted['id']}-10.pt" in response.headers["content-disposition"]


@pytest.mark.parametrize(("header", "span"), [("bytes=0-99", (0, 100)), ("bytes=5000-", (5000, None)),
                                              ("bytes=-10", (-10, None))])
def test_range_answers_206_with_those_bytes(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    checkpoint_file: tuple[str, bytes], header: str, span: tuple[int, int | None],
) -> None:
    _, content = checkpoint_file
    response = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/10",
                          headers={**alice, "Range": header})
    expected = content[span[0]:span[1]]
    start = span[0] % len(content)
    assert response.status_code == 206 and response.content == expected
    assert response.headers["content-range"] == f"bytes {start}-{start + len(expected) - 1}/{len(content)}"


def test_a_range_past_the_end_is_416(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], checkpoint_file: tuple[str, bytes]
) -> None:
    _, content = checkpoint_file
    response = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/10",
                          headers={**alice, "Range": f"bytes={len(content)}-"})
    assert response.status_code == 416
    assert response.headers["content-range"] == f"bytes */{len(content)}"
    assert "outside" in response.json()["detail"]


def test_if_none_match_with_the_etag_is_304(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], checkpoint_file: tuple[str, bytes]
) -> None:
    url = f"/v1/jobs/{submitted['id']}/checkpoints/10"
    etag = client.get(url, headers=alice).headers["ETag"]

    cached = client.get(url, headers={**alice, "If-None-Match": etag})
    stale = client.get(url, headers={**alice, "If-None-Match": '"0000"'})

    assert cached.status_code == 304 and cached.content == b""
    assert cached.headers["ETag"] == etag
    assert stale.status_code == 200


def test_missing_step_or_missing_object_is_404(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    checkpoint_file: tuple[str, bytes], api_settings: Settings,
) -> None:
    key, _ = checkpoint_file
    no_row = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/11", headers=alice)
    open_store(api_settings.artifacts_url).delete(key)
    no_object = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/10", headers=alice)

    assert no_row.status_code == 404 and "no checkpoint at step 11" in no_row.json()["detail"]
    assert no_object.status_code == 404 and "gone" in no_object.json()["detail"]


def test_redirect_to_a_presigned_url_on_s3(
    api_settings: Settings, client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    checkpoint_file: tuple[str, bytes],
) -> None:
    _, content = checkpoint_file
    api_settings.download_redirect = True  # the app holds this object
    response = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/10", headers=alice,
                          follow_redirects=False)
    if not api_settings.artifacts_on_s3:  # a local store has no URL to give: it streams
        assert response.status_code == 200 and response.content == content
        return
    assert response.status_code == 307
    assert response.headers["ETag"] == f'"{hashlib.sha256(content).hexdigest()}"'
    presigned = httpx.get(response.headers["location"])  # no token: the signature is the permission
    assert presigned.status_code == 200 and presigned.content == content


def test_non_integer_step_is_422(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any]
) -> None:
    response = client.get(f"/v1/jobs/{submitted['id']}/checkpoints/latest", headers=alice)

    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == "path.step"


def finish(session_factory: sessionmaker[Session], job_id: str, status: str = "failed") -> None:
    with session_factory.begin() as session:
        job = jobs.load_job(session, job_id)
        assert job is not None
        job.status = status


def test_delete_removes_objects_rows_metrics_and_events_of_a_finished_job(
    api_settings: Settings, client: TestClient, alice: dict[str, str], bob: dict[str, str],
    admin: dict[str, str], submitted: dict[str, Any], checkpoint_file: tuple[str, bytes],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    running = client.delete(f"/v1/jobs/{job_id}", headers=alice)
    assert running.status_code == 409 and "cancel it first" in running.json()["detail"]
    finish(session_factory, job_id)
    assert client.delete(f"/v1/jobs/{job_id}", headers=bob).status_code == 404  # not bob's
    assert client.delete(f"/v1/jobs/{job_id}", headers=alice).status_code == 204
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).status_code == 404
    assert open_store(api_settings.artifacts_url).list(f"{job_id}/") == []
    with session_factory() as session:
        assert checkpoints.list_checkpoints(session, job_id) == []
    # An admin deletes anyone's finished job.
    other = client.post("/v1/jobs", json=submitted["spec"], headers=bob).json()
    finish(session_factory, other["id"], "cancelled")
    assert client.delete(f"/v1/jobs/{other['id']}", headers=admin).status_code == 204
