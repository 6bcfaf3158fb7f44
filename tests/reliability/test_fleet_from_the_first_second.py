"""The fleet check holds from the first answer of ``accum up``: its worker registers before its
API answers, so a ``gpus: 2`` job sent the moment the port opens is the same 422 as a minute
later (before, the API came up first, found no registered worker, checked nothing and took
the job: 201, then 2 CPU ranks on a worker that offered none).

    .venv/bin/python -m pytest tests/reliability/test_fleet_from_the_first_second.py -x -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from worker_stack import BASE_SPEC, ROOT

from services.cli.admin import create_token, upgrade_database
from services.ports import free_port
from services.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # real workers: minutes on a loaded machine

UP_TIMEOUT_S = 240.0  # the worker imports torch first; slow on a loaded 2-core machine


def first_answer(url: str, token: str, spec: dict[str, Any], up: subprocess.Popen[bytes],
                 log: Path) -> tuple[httpx.Response, float]:
    """POST the spec from the moment ``accum up`` starts until the API answers at all;
    returns that first answer and the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < UP_TIMEOUT_S:
        if up.poll() is not None:
            pytest.fail(f"accum up exited with {up.returncode}:\n{log.read_text(errors='replace')}")
        try:
            response = httpx.post(f"{url}/v1/jobs", json=spec, timeout=10,
                                  headers={"Authorization": f"Bearer {token}"})
        except httpx.TransportError:  # not listening yet
            time.sleep(0.02)
            continue
        return response, time.monotonic() - started
    pytest.fail(f"accum up did not answer within {UP_TIMEOUT_S} s:\n{log.read_text(errors='replace')}")


def test_a_gpus_2_job_sent_at_the_first_answer_of_accum_up_is_refused(
    tmp_path: Path, record_figure: Any
) -> None:
    home, port = tmp_path / "home", free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ACCUM_")}, "ACCUM_HOME": str(home),
           "XDG_CONFIG_HOME": str(tmp_path / "user-config"),  # `accum up` records itself there
           "ACCUM_ALLOW_ROOT": "1"}  # its worker, where tests run as root
    # The token exists before `accum up` starts, so the first request can already carry it.
    settings = Settings(home=home)
    upgrade_database(settings)
    token = create_token(settings, "first-second", admin=True)
    spec = {**BASE_SPEC, "gpus": 2}
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "up", "--port", str(port),
             "--log-dir", str(tmp_path / "logs")],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        response, after_s = first_answer(url, token, spec, up, log)
        minute_later = httpx.post(f"{url}/v1/jobs", json=spec, timeout=10,
                                  headers={"Authorization": f"Bearer {token}"})
        workers = httpx.get(f"{url}/v1/workers", timeout=10,
                            headers={"Authorization": f"Bearer {token}"}).json()["items"]
        listed = httpx.get(f"{url}/v1/jobs", timeout=10,
                           headers={"Authorization": f"Bearer {token}"}).json()["items"]
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)
    errors = response.json().get("errors", []) if response.status_code == 422 else []
    record_figure(
        "fleet_check_first_answer_of_accum_up", area="limits",
        check="`accum up`, a gpus: 2 job POSTed from the moment the port opens (no GPU, no "
              "--cpu-ranks), then again",
        figure=f"first answer {after_s:.1f} s after start: {response.status_code} "
               f"{[e['loc'] for e in errors]}; again: {minute_later.status_code}; "
               f"{len(listed)} jobs stored",
        passed=response.status_code == 422 and minute_later.status_code == 422 and not listed,
    )

    assert response.status_code == 422, (response.status_code, response.text)
    (error,) = errors
    assert error["loc"] == "body.gpus" and error["allowed"] == [0, 1], error
    assert "--cpu-ranks" in error["msg"]
    assert minute_later.status_code == 422 and minute_later.json()["errors"] == errors
    assert listed == []  # nothing was taken
    (worker,) = workers
    assert worker["state"] in ("idle", "busy") and worker["devices"][0]["kind"] == "cpu"
    assert "ranks" not in worker["devices"][0]
