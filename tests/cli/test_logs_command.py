"""`accum logs` and the client's logs against a real API server: `--follow` (the SSE stream)
prints lines as they are stored and ends when the job does; a job that printed nothing says
so on stderr; a bad --attempt is a usage error (the capture itself: tests/integration/test_job_logs.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from cli_helpers import Server, accum_in_process

from accum import AccumClient


def test_following_prints_lines_as_they_come_and_ends_with_the_job(
    client: AccumClient, seed: Any, tiny_spec: dict[str, Any]
) -> None:
    job_id = client.submit(tiny_spec)["id"]
    seed.claim(job_id, "w1")
    seed.prints(job_id, 1, [("stdout", "epoch 1 starts")])
    followed: list[str] = []
    first_seen = threading.Event()

    def follow() -> None:
        for item in client.follow_logs(job_id):
            followed.append(item["line"])
            first_seen.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert first_seen.wait(20), "the stream sent nothing"
    seed.prints(job_id, 1, [("stderr", "UserWarning: small batch"), ("stdout", "epoch 2 starts")])
    seed.finish(job_id, "w1", "succeeded")
    reader.join(30)
    assert not reader.is_alive(), "the stream did not end with the job"
    assert followed == ["epoch 1 starts", "UserWarning: small batch", "epoch 2 starts"]
    assert [i["line"] for i in client.logs(job_id, attempt=1, limit=2)] == followed[:2]


def test_a_job_that_printed_nothing_says_so_and_a_bad_attempt_is_refused(
    cli_env: Server, client: AccumClient, tiny_spec: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = client.submit(tiny_spec)["id"]
    code = accum_in_process(capsys, "logs", job_id[:12])
    assert code[0] == 0 and code[1] == ""
    assert "has printed nothing" in code[2] and "queued job has not started" in code[2]
    with pytest.raises(SystemExit) as usage:
        accum_in_process(capsys, "logs", job_id, "--attempt", "0")
    assert usage.value.code == 2
    assert "--attempt takes a whole number from 1" in capsys.readouterr().err
