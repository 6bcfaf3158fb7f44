"""`accum workers` at 80 columns: name, state, queues, devices for owners; the current job and
when each was last seen for admins; stopped workers only with `--all`. And `accum status`
names a queued job's place in line and a priority that is not normal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cli_helpers import accum_in_process as accum
from cli_helpers import assert_fits
from sqlalchemy import delete
from worker_rows import worker_row

from accum import AccumClient
from services.catalog import DATASETS, MODELS
from services.jobdb import workers as store_workers
from services.jobdb.models import Worker


@pytest.fixture
def fleet(seed: Any) -> Iterator[None]:
    """Two live workers and a stopped one, able to build the whole catalog (other tests of
    this server submit to `default`); removed afterwards (no workers: no submit checks)."""
    names = {"models": sorted(MODELS), "datasets": sorted(DATASETS)}
    with seed.sessions.begin() as session:
        store_workers.register(session, worker_row("gpu0@node1", ["a100", "default"], gpus=2, **names))
        store_workers.register(session, worker_row("cpu@node2", ["default"], **names))
        store_workers.register(session, worker_row("old@node3", ["default"], **names))
        store_workers.mark_stopped(session, "old@node3")
    try:
        yield
    finally:
        with seed.sessions.begin() as session:
            session.execute(delete(Worker))


@pytest.mark.usefixtures("fleet")
def test_workers_lists_state_queues_and_devices(
    cli_env: Any, capsys: pytest.CaptureFixture[str], admin_token: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, _ = accum(capsys, "workers")
    assert code == 0
    assert_fits(out)
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "QUEUES", "DEVICES"]
    assert [line.split()[0] for line in lines[1:]] == ["cpu@node2", "gpu0@node1"]
    assert "a100,default" in lines[2] and "2x NVIDIA A100 (80 GiB)" in lines[2]
    assert "cpu, 4 cores" in lines[1] and "idle" in lines[1]

    monkeypatch.setenv("ACCUM_TOKEN", admin_token)
    code, out, _ = accum(capsys, "workers", "--all")
    assert code == 0
    assert_fits(out)
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "QUEUES", "DEVICES", "JOB", "SEEN"]
    assert "stopped" in lines[3] and lines[1].rstrip().endswith("ago")


def test_status_shows_the_place_in_line_and_a_lowered_priority(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient,
    tiny_spec: dict[str, Any],
) -> None:
    queue = "line-test"
    first = client.submit({**tiny_spec, "queue": queue})
    low = client.submit({**tiny_spec, "queue": queue, "priority": "low", "seed": 1})
    code, out, _ = accum(capsys, "status", low["id"])
    assert code == 0
    fields = {line.split("  ", 1)[0].strip(): line.split("  ", 1)[1].strip()
              for line in out.splitlines() if not line.startswith(" ")}
    assert fields["queue"] == f"{queue}, priority low, position 2 in line"
    code, out, _ = accum(capsys, "status", first["id"])
    assert f"{queue}, position 1 in line" in out
