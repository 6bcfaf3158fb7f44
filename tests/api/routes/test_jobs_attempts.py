"""The job's record of who ran it: every attempt (worker, start, end, outcome, the step it
resumed from, steps done) in `GET /v1/jobs/{id}`, the worker's name on the job, and the SSE
`status` message carrying the same job object as GET (owner and attempts included)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from accum import parse_sse
from services.jobdb import leases
from services.jobdb.attempts import record_process_death
from services.jobdb.types import utcnow


def claim(session_factory: sessionmaker[Session], job_id: str, name: str, **kwargs: Any) -> Any:
    with session_factory.begin() as session:
        job = leases.claim_job(session, job_id, f"{name}/x", "node", "cpu", 60,
                               worker_name=name, **kwargs)
        assert job is not None
        return job


def progress(session_factory: sessionmaker[Session], job_id: str, step: int) -> None:
    with session_factory.begin() as session:
        leases.update_progress(session, job_id, {"optimizer_step": step})


def test_each_attempt_is_listed_with_its_worker_outcome_and_steps(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    claim(session_factory, job_id, "gpu0@node1")
    progress(session_factory, job_id, 7)
    running = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    (first,) = running["attempts"]
    assert (first["worker"], first["outcome"], first["steps_done"]) == ("gpu0@node1", "running", 7)
    assert running["worker"]["name"] == "gpu0@node1" and first["ended_at"] is None

    # Its worker shuts down and hands the job back; another takes it, dies, a third finishes.
    with session_factory.begin() as session:
        assert leases.hand_back_job(session, job_id, "gpu0@node1/x") is not None
    claim(session_factory, job_id, "gpu1@node1")
    progress(session_factory, job_id, 12)
    with session_factory.begin() as session:
        leases.reap_expired_leases(session, now=utcnow() + timedelta(seconds=61))
    claim(session_factory, job_id, "gpu0@node2")
    progress(session_factory, job_id, 20)
    with session_factory.begin() as session:
        assert leases.finish_job(session, job_id, "gpu0@node2/x", "succeeded")

    job = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    rows = [(a["attempt"], a["worker"], a["outcome"], a["resume_step"], a["end_step"])
            for a in job["attempts"]]
    assert rows == [
        (1, "gpu0@node1", "handed_back", None, 7),
        (2, "gpu1@node1", "lost", None, 12),
        (3, "gpu0@node2", "succeeded", None, 20),
    ]
    assert [a["steps_done"] for a in job["attempts"]] == [7, 12, 20]
    assert all(a["ended_at"] >= a["started_at"] for a in job["attempts"])
    assert job["started_at"] == job["attempts"][-1]["started_at"]  # the latest attempt's
    assert job["worker"]["name"] == "gpu0@node2"


def test_a_takeover_ends_the_dead_workers_attempt_as_lost(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    claim(session_factory, job_id, "a@n")
    with session_factory.begin() as session:
        leases.claim_job(session, job_id, "b@n/y", "n", None, 60,
                         now=utcnow() + timedelta(seconds=61), worker_name="b@n")
    outcomes = [(a["worker"], a["outcome"]) for a in
                client.get(f"/v1/jobs/{job_id}", headers=alice).json()["attempts"]]
    assert outcomes == [("a@n", "lost"), ("b@n", "running")]


def test_the_streams_status_message_is_the_job_object_of_get(
    client: TestClient, alice: dict[str, str], admin: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    claim(session_factory, job_id, "gpu0@node1")
    with session_factory.begin() as session:
        leases.finish_job(session, job_id, "gpu0@node1/x", "failed",
                          {"type": "ValueError", "message": "bad"})
    for headers in (alice, admin):  # an admin watching alice's job sees alice named too
        got = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        stream = client.get(f"/v1/jobs/{job_id}/events",
                            headers={**headers, "Accept": "text/event-stream"})
        status = [d for e, d in parse_sse(iter(stream.text.splitlines())) if e == "status"]
        assert status == [got] and got["owner"] == "alice" and len(got["attempts"]) == 1


def test_a_process_death_seen_by_its_worker_is_the_attempts_cause(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    claim(session_factory, job_id, "gpu0@node1")
    progress(session_factory, job_id, 3)
    with session_factory.begin() as session:
        # A worker that never ran the job: nothing is written.
        assert record_process_death(session, job_id, "gpu9@node1", "killed by signal 9 (SIGKILL)") is None
        assert record_process_death(session, job_id, "gpu0@node1", "killed by signal 9 (SIGKILL)") == 1
    job = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert [(a["outcome"], a["cause"]) for a in job["attempts"]] == [
        ("running", "killed by signal 9 (SIGKILL)")]
    events = client.get(f"/v1/jobs/{job_id}/events", headers=alice).json()
    died = [e for e in events["items"] if e["kind"] == "process_died"]
    assert len(died) == 1 and died[0]["data"]["step"] == 3
    # Its lease expired with the death: the reaper re-queues the job now, not a lease later.
    with session_factory.begin() as session:
        requeued, _ = leases.reap_expired_leases(session, now=utcnow() + timedelta(seconds=1))
    assert requeued == [job_id]


def test_an_attempts_phases_are_answered_in_the_order_its_worker_timed_them(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    from services.jobdb.attempts import record_phases

    job_id = submitted["id"]
    claim(session_factory, job_id, "gpu0@node1")
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).json()["attempts"][0]["phases"] is None
    taken = {"claim": 0.012, "admit": 0.003, "build": 0.2, "checks": 0.05, "train": 0.9,
             "final_writes": 0.04, "finish": 0.006}
    with session_factory.begin() as session:
        assert leases.finish_job(session, job_id, "gpu0@node1/x", "succeeded")
        record_phases(session, job_id, 1, taken)
    (attempt,) = client.get(f"/v1/jobs/{job_id}", headers=alice).json()["attempts"]
    assert list(attempt["phases"].items()) == list(taken.items())
