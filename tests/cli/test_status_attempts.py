"""`accum status` against a real API: every attempt of a restarted job (number, node, start,
end, outcome and how its process died, time), the whole job's time (not its last attempt's),
its tracker links, its latest system sample on one line, and the 6-character short id that
`accum jobs` shows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from cli_helpers import accum_in_process, assert_fits
from sqlalchemy import update

from accum import AccumClient
from services.jobdb.attempts import record_process_death
from services.jobdb.leases import claim_job
from services.jobdb.models import Job
from services.jobdb.tracker_runs import open_run, set_identity
from services.jobdb.types import utcnow


def test_status_lists_the_attempts_the_whole_time_and_the_tracker_link(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any],
) -> None:
    job = client.submit(tiny_spec)
    job_id = str(job["id"])
    start = utcnow() - timedelta(seconds=300)
    url = f"http://mlflow.example:5000/#/experiments/1/runs/r{job_id[-6:]}"
    with seed.sessions.begin() as session:  # as a worker that was SIGKILLed, then another's takeover
        # This server offers no tracker (ACCUM_TRACKERS): the job as one that asked for mlflow.
        session.execute(update(Job).where(Job.id == job_id).values(spec={**job["spec"], "trackers": ["mlflow"]}))
        assert claim_job(session, job_id, "w1@a/1", "host-a", None, 60, now=start, worker_name="w1@a")
        record_process_death(session, job_id, "w1@a", "killed by signal 9 (SIGKILL)",
                             now=start + timedelta(seconds=100))
    with seed.sessions.begin() as session:
        assert claim_job(session, job_id, "w2@b/1", "host-b", None, 60,
                         now=start + timedelta(seconds=200), worker_name="w2@b", poison_after=3)
        open_run(session, job_id, "mlflow")
        set_identity(session, job_id, "mlflow", f"r{job_id[-6:]}", url)
    seed.progress(job_id, 23, {"loss": 0.5, "host_cpu_percent": 35.2, "host_memory_percent": 41.0,
                                "process_rss_bytes": 312.4 * 2**20})
    seed.finish(job_id, "w2@b/1", "succeeded")

    code, out, _ = accum_in_process(capsys, "status", job_id[-6:])

    assert code == 0
    assert_fits(out)
    fields = dict(line.split(None, 1) for line in out.split("\nattempts\n")[0].splitlines())
    assert fields["id"] == job_id and fields["status"] == "succeeded (attempt 2)"
    assert fields["took"].startswith("5 min 0"), fields["took"]  # from attempt 1's start
    assert fields["mlflow"] == url
    assert fields["system"] == "host CPU 35%, memory 41%, RSS 312.4 MiB" and "process_rss_bytes" not in out
    header, first, second, cause = out.split("\nattempts\n")[1].splitlines()
    assert header.split() == ["#", "node(s)", "started", "ended", "outcome", "took"]
    assert first.split()[:2] == ["1", "w1@a"] and first.endswith("lost       3 min 20 s")
    assert second.split()[:2] == ["2", "w2@b"] and "succeeded" in second
    assert cause == "  attempt 1: killed by signal 9 (SIGKILL)"


def test_jobs_shows_short_ids_that_status_takes(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, tiny_spec: dict[str, Any],
) -> None:
    ids = [str(client.submit({**tiny_spec, "name": f"short-{i}"})["id"]) for i in range(3)]
    code, out, _ = accum_in_process(capsys, "jobs", "--limit", "3")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[1:4]] == [i[-6:] for i in reversed(ids)]
    for given in (ids[0][-6:], ids[0][:12]):  # the short id, and the time prefix lists showed before
        code, out, _ = accum_in_process(capsys, "status", given)
        assert code == 0 and out.splitlines()[0].split() == ["id", ids[0]]
