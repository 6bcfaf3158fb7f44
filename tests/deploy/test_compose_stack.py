"""The compose stack, built and run as a user would (`make compose-test`; needs Docker).

docker/compose_test.sh builds the images first; here docker-compose.yml plus the CPU override
docker/compose.test.yml comes up (postgres, redis, the S3 stand-in, bucket, migrate, api,
worker-cpu), then: a token made in the API container, a job submitted over HTTP, a restart
of the worker container while the job runs (the job resumes from its checkpoint), the job
succeeding, its checkpoint read back from the S3 store and checked against its sha256, a
second migrate run on the same volume that changes nothing, and everything torn down.
Marked `compose`: `make test` deselects it (no Docker engine there); compose-test runs it.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from accum import AccumClient

ROOT = Path(__file__).resolve().parents[2]
ADDRESS = os.environ.get("ACCUM_TEST_ADDR", "127.0.0.2")
PROJECT = "accumtest"
COMPOSE_CLI = [*os.environ.get("COMPOSE", "docker-compose").split(), "-p", PROJECT]
FILES = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "docker" / "compose.test.yml")]
# What runs: the two files merged (`config`), less the published ports, which host networking
# refuses and no longer needs (an override can add to a list, not remove from it).
MERGED = ROOT / ".accum" / "compose-test.yml"
# `up api worker-cpu` starts these (the GPU workers stay down: no GPU reservation here).
STARTED = ("postgres", "redis", "minio", "bucket", "migrate", "api", "worker-cpu")
SECRETS = {"POSTGRES_PASSWORD": "compose-test-pw", "MINIO_ROOT_USER": "accum",
           "MINIO_ROOT_PASSWORD": "compose-test-secret", "ACCUM_TEST_ADDR": ADDRESS}
# Long enough to restart the worker in the middle: 5 epochs of digits, a checkpoint every 5 steps.
SPEC: dict[str, Any] = {
    "name": "compose-test", "model": "small_cnn", "dataset": "digits",
    # 100 epochs (about 2,200 steps): still training when its first checkpoint is seen and the
    # worker restarted (5 epochs ended first once the trainer's host cost fell: issue 32).
    "micro_batch_size": 16, "accumulation_steps": 4, "epochs": 100, "seed": 0,
    "optimizer": {"name": "adamw", "lr": 0.003}, "checkpoint_every": 25, "keep_checkpoints": 50,
}

pytestmark = [pytest.mark.compose, pytest.mark.timeout(1800)]


def compose(*args: str, timeout: float = 600, files: list[str] | None = None) -> str:
    env = {**os.environ, **SECRETS}
    files = ["-f", str(MERGED)] if files is None else files
    result = subprocess.run([*COMPOSE_CLI, *files, *args], capture_output=True, text=True,
                            env=env, timeout=timeout, check=False, cwd=ROOT)
    assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def wait_for(what: str, check: Any, timeout: float, every: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s\n{compose('logs', '--tail', '60')}")


def write_merged_file() -> None:
    merged = yaml.safe_load(compose("config", files=FILES))
    for name in STARTED:
        assert merged["services"][name].get("network_mode") == "host", f"{name} is not on the host's network"
    for service in merged["services"].values():
        service.pop("ports", None)
    MERGED.parent.mkdir(exist_ok=True)
    MERGED.write_text(yaml.safe_dump(merged))


@pytest.fixture(scope="module")
def stack() -> Iterator[str]:
    write_merged_file()
    compose("down", "-v", "--remove-orphans")
    started = time.monotonic()
    try:
        compose("up", "-d", "--no-build", "api", "worker-cpu", timeout=900)
        url = f"http://{ADDRESS}:8000"

        def ready() -> bool:
            try:
                with AccumClient(url, "none") as client:
                    return client.readyz().get("status") == "ready"
            except Exception:
                return False

        wait_for("the API ready", ready, 300)
        print(f"stack up and ready in {time.monotonic() - started:.0f} s")
        yield url
    finally:
        compose("down", "-v", "--remove-orphans")


def test_a_job_trains_survives_a_worker_restart_and_its_checkpoint_is_in_s3(stack: str) -> None:
    token = compose("exec", "-T", "api", "accum", "token", "create", "alice").strip().splitlines()[-1]
    assert token.startswith("accum_")
    with AccumClient(stack, token) as client:
        job_id = str(client.submit(SPEC)["id"])
        wait_for("a first checkpoint", lambda: client.checkpoints(job_id), 600)
        assert client.job(job_id)["status"] == "running"

        before = max(int(c["step"]) for c in client.checkpoints(job_id))
        compose("restart", "worker-cpu", timeout=300)  # SIGTERM mid-job, then a fresh start
        final = wait_for(
            "the job to finish",
            lambda: (job := client.job(job_id))["status"] in ("succeeded", "failed", "cancelled") and job,
            900,
        )
        assert final["status"] == "succeeded", final
        assert len(final["attempts"]) >= 2, "the restart should have handed the job back"
        # "attempt 2 started on <host> from checkpoint step K": K is at least the last
        # checkpoint seen before the restart (the worker may checkpoint once more on SIGTERM).
        events = client.all_events(job_id)
        restarted = [e for e in events if e["kind"] == "started" and e["attempt"] >= 2]
        assert restarted, [(e["attempt"], e["kind"], e["message"]) for e in events]
        resumed = re.search(r"from checkpoint step (\d+)", restarted[0]["message"])
        assert resumed and int(resumed.group(1)) >= before > 0, restarted[0]["message"]

        checkpoints = client.checkpoints(job_id)
        last = max(checkpoints, key=lambda c: int(c["step"]))
    body = read_from_s3(f"artifacts/{job_id}/{last['step']}.pt")
    assert len(body) == last["size_bytes"]
    assert hashlib.sha256(body).hexdigest() == last["sha256"]

    # A newer release on the same volumes runs migrate again: already at head, nothing to do.
    again = compose("run", "--rm", "migrate")
    assert "Running upgrade" not in again


def read_from_s3(key: str) -> bytes:
    """The object as the S3 store holds it (the stand-in's endpoint, on the loopback address)."""
    from obstore.store import S3Store

    store = S3Store("accum", endpoint=f"http://{ADDRESS}:9000", region="us-east-1",
                    access_key_id=SECRETS["MINIO_ROOT_USER"],
                    secret_access_key=SECRETS["MINIO_ROOT_PASSWORD"], client_options={"allow_http": True})
    import obstore

    return bytes(obstore.get(store, key).bytes())
