"""Downloads with ACCUM_DOWNLOAD_REDIRECT=1 on an S3 store: a real `accum api` answers 307 to a
presigned URL on the S3 server (moto); the client follows it without sending its token there
and still checks the sha256 (a damaged object is refused)."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_helpers import ACCUM, Server, accum_env, run_accum, wait_until_ready
from job_specs import MINIMAL_SPEC

from accum import AccumAPIError, AccumClient
from services.artifacts import open_store
from services.jobdb import checkpoints
from services.jobdb.db import make_engine, make_session_factory
from services.ports import free_port
from services.settings import Settings


@pytest.fixture
def redirecting_api(tmp_path: Path, s3_url: str, s3_server: Any) -> Iterator[Server]:
    home = tmp_path / "home"
    env = {**accum_env(home), **s3_server.env, "ACCUM_ARTIFACTS_URL": s3_url,
           "ACCUM_DOWNLOAD_REDIRECT": "1"}
    assert run_accum("db", "upgrade", env=env).returncode == 0
    token = run_accum("token", "create", "redirect", env=env).stdout.strip()
    port = free_port()
    process = subprocess.Popen([ACCUM, "api", "--port", str(port), "--log-level", "warning"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", process, 60)
        yield Server(url=f"http://127.0.0.1:{port}", token=token, home=home, env=env)
    finally:
        process.terminate()
        process.wait(10)


def stored_checkpoint(server: Server, job_id: str, step: int, content: bytes,
                      recorded_sha256: str | None = None) -> None:
    settings = Settings(home=server.home, artifacts_url=server.env["ACCUM_ARTIFACTS_URL"])
    source = server.home / "upload.pt"
    source.write_bytes(content)
    open_store(settings.artifacts_url).put(f"{job_id}/{step}.pt", source)
    engine = make_engine(settings)
    try:
        with make_session_factory(engine).begin() as session:
            checkpoints.add_checkpoint(
                session, job_id, step, f"{job_id}/{step}.pt", len(content),
                recorded_sha256 or hashlib.sha256(content).hexdigest())
    finally:
        engine.dispose()


def test_the_client_follows_the_presigned_redirect_and_checks_the_sha256(
    redirecting_api: Server, tmp_path: Path
) -> None:
    with AccumClient(redirecting_api.url, redirecting_api.token) as client:
        job = client.submit({**MINIMAL_SPEC, "optimizer": dict(MINIMAL_SPEC["optimizer"])})
        content = b"weights" * 20_000
        stored_checkpoint(redirecting_api, job["id"], 5, content)
        raw = httpx.get(f"{redirecting_api.url}/v1/jobs/{job['id']}/checkpoints/5",
                        headers={"Authorization": f"Bearer {redirecting_api.token}"})
        assert raw.status_code == 307
        assert raw.headers["location"].startswith(redirecting_api.env["AWS_ENDPOINT_URL"])
        saved = client.download(job["id"], 5, tmp_path / "model.pt")
        assert saved.read_bytes() == content

        stored_checkpoint(redirecting_api, job["id"], 6, b"bytes", recorded_sha256="f" * 64)
        with pytest.raises(AccumAPIError, match="sha256"):
            client.download(job["id"], 6, tmp_path / "bad.pt")
        assert not (tmp_path / "bad.pt").exists()
