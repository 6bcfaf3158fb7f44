"""Worker-side transitions: atomic claim, lease renewal, progress, finish, and reaping."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import checkpoints, events, jobs, leases
from services.jobdb.models import Job
from services.jobdb.types import utcnow

LEASE_S = 60


def row(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    assert job is not None, job_id
    return job


def claim(session_factory: sessionmaker[Session], job_id: str, worker: str, **kwargs) -> Job | None:
    with session_factory.begin() as session:
        return leases.claim_job(session, job_id, worker, f"host-{worker}", "0", LEASE_S, **kwargs)


def load(session_factory: sessionmaker[Session], job_id: str) -> Job:
    with session_factory() as session:
        job = jobs.load_job(session, job_id)
        assert job is not None
        return job


def test_claim_marks_the_job_running_with_a_lease(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    before = utcnow()
    claimed = claim(session_factory, job.id, "w1")
    assert claimed is not None
    stored = load(session_factory, job.id)
    assert (stored.status, stored.attempts, stored.lease_owner) == ("running", 1, "w1")
    assert (stored.worker_host, stored.worker_gpu) == ("host-w1", "0")
    assert stored.started_at is not None and stored.started_at >= before
    assert stored.lease_expires_at is not None
    assert stored.lease_expires_at - stored.started_at == timedelta(seconds=LEASE_S)
    # A second message for the same job while the lease is live is dropped.
    assert claim(session_factory, job.id, "w2") is None
    assert claim(session_factory, "no-such-job", "w2") is None


def race_to_claim(
    session_factory: sessionmaker[Session], job_id: str, workers: list[str]
) -> list[str]:
    """Start all workers' claims at the same instant; returns the winners."""
    barrier = threading.Barrier(len(workers))
    winners: list[str] = []
    errors: list[BaseException] = []

    def race(worker: str) -> None:
        try:
            barrier.wait()
            if claim(session_factory, job_id, worker) is not None:
                winners.append(worker)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return winners


def test_concurrent_claimers_exactly_one_wins(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    for seed in range(3):
        job_id = make_job(seed=seed).id
        winners = race_to_claim(session_factory, job_id, [f"w{i}" for i in range(4)])
        assert len(winners) == 1, winners
        stored = load(session_factory, job_id)
        assert stored.lease_owner == winners[0] and stored.attempts == 1
        with session_factory() as session:
            kinds = [e.kind for e in events.list_events(session, job_id)]
        assert kinds == ["created", "started"]


def test_renew_reports_status_and_a_lost_lease(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    claim(session_factory, job.id, "w1")
    later = utcnow() + timedelta(seconds=30)
    with session_factory.begin() as session:
        assert leases.renew_lease(session, job.id, "w1", LEASE_S, now=later) == "running"
        assert leases.renew_lease(session, job.id, "impostor", LEASE_S) is None
    stored = load(session_factory, job.id)
    assert stored.lease_expires_at == later + timedelta(seconds=LEASE_S)
    assert stored.heartbeat_at == later
    # After the reaper takes the job away, the old worker learns it on its next renewal.
    with session_factory.begin() as session:
        requeued, _ = leases.reap_expired_leases(
            session, now=later + timedelta(seconds=LEASE_S + 1)
        )
    assert requeued == [job.id]
    with session_factory.begin() as session:
        assert leases.renew_lease(session, job.id, "w1", LEASE_S) is None


def test_expired_lease_can_be_taken_over_and_resumes_from_latest_checkpoint(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    claim(session_factory, job.id, "w1")
    with session_factory.begin() as session:
        checkpoints.add_checkpoint(session, job.id, 8, "/a/8.pt", 1, "0" * 64, attempt=1)
    assert claim(session_factory, job.id, "w2") is None  # lease still live
    after_expiry = utcnow() + timedelta(seconds=LEASE_S + 1)
    taken = claim(session_factory, job.id, "w2", now=after_expiry)
    assert taken is not None
    assert (taken.lease_owner, taken.attempts, taken.restarts, taken.resume_step) == ("w2", 2, 1, 8)
    with session_factory.begin() as session:  # the dead worker's writes are refused
        assert leases.renew_lease(session, job.id, "w1", LEASE_S) is None
        assert not leases.update_progress(session, job.id, {"optimizer_step": 99}, worker_id="w1")
        assert not leases.finish_job(session, job.id, "w1", "succeeded")
    with session_factory() as session:
        kinds = [e.kind for e in events.list_events(session, job.id)]
    assert kinds == ["created", "started", "lease_expired", "started"]


def test_update_progress_merges_into_the_row(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job(total_optimizer_steps=40)
    claim(session_factory, job.id, "w1")
    with session_factory.begin() as session:
        assert leases.update_progress(
            session, job.id, {"epoch": 1, "optimizer_step": 12}, {"loss": 0.5}, "w1"
        )
        assert leases.update_progress(session, job.id, None, {"val_loss": 0.7}, "w1")
    stored = load(session_factory, job.id)
    assert stored.progress == {"epoch": 1, "optimizer_step": 12, "total_optimizer_steps": 40}
    assert stored.latest_metrics == {"loss": 0.5, "val_loss": 0.7}


def test_non_finite_latest_metrics_are_stored_as_labels(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    """A JSON column has no NaN (PostgreSQL refuses the whole write): a diverged run's latest
    loss is kept as "NaN", and the worker's progress write still goes through."""
    job = make_job(total_optimizer_steps=40)
    claim(session_factory, job.id, "w1")
    with session_factory.begin() as session:
        assert leases.update_progress(
            session, job.id, {"optimizer_step": 2},
            {"loss": math.nan, "grad_norm": math.inf, "lr": -math.inf, "val_loss": 0.5}, "w1",
        )
    assert load(session_factory, job.id).latest_metrics == {
        "loss": "NaN", "grad_norm": "inf", "lr": "-inf", "val_loss": 0.5,
    }


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "cancelled"])
def test_finish_records_the_outcome_and_releases_the_lease(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job], outcome: str
) -> None:
    job = make_job()
    claim(session_factory, job.id, "w1")
    error = (
        {"type": "ValueError", "message": "data root /nope does not exist"}
        if outcome == "failed"
        else None
    )
    with session_factory.begin() as session:
        assert leases.finish_job(session, job.id, "w1", outcome, error)
    stored = load(session_factory, job.id)
    assert (stored.status, stored.error, stored.lease_owner) == (outcome, error, None)
    assert stored.finished_at is not None
    with session_factory() as session:
        last = events.list_events(session, job.id)[-1]
    assert last.kind == outcome and last.attempt == 1
    with session_factory.begin() as session:  # finishing twice is refused
        assert not leases.finish_job(session, job.id, "w1", "succeeded")


def test_finish_refuses_nonsense(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    claim(session_factory, job.id, "w1")
    with session_factory.begin() as session:
        with pytest.raises(ValueError, match="finish status must be one of"):
            leases.finish_job(session, job.id, "w1", "running")
        with pytest.raises(ValueError, match="error="):
            leases.finish_job(session, job.id, "w1", "failed")


def test_reaper_requeues_then_fails_after_max_restarts(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job(max_restarts=2)
    live = make_job(seed=9)
    now = utcnow()
    assert claim(session_factory, live.id, "live", now=now) is not None
    for attempt in (1, 2, 3):
        assert claim(session_factory, job.id, f"w{attempt}", now=now) is not None
        with session_factory.begin() as session:
            checkpoints.add_checkpoint(
                session, job.id, attempt * 10, "/x", 1, "0" * 64, attempt=attempt
            )
            # The live job's worker keeps renewing past the reaper's "now".
            assert leases.renew_lease(session, live.id, "live", 2 * LEASE_S, now=now) == "running"
        now += timedelta(seconds=LEASE_S + 1)
        with session_factory.begin() as session:
            requeued, failed = leases.reap_expired_leases(session, now=now)
        stored = load(session_factory, job.id)
        if attempt <= 2:
            assert (requeued, failed) == ([job.id], [])
            assert (stored.status, stored.restarts, stored.resume_step) == (
                "queued",
                attempt,
                attempt * 10,
            )
            assert stored.lease_owner is None
        else:
            assert (requeued, failed) == ([], [job.id])
            assert stored.status == "failed" and stored.error is not None
            assert stored.error["type"] == "LeaseExpired" and stored.error["reason"] == "max_restarts"
            assert (
                "max_restarts=2" in stored.error["message"] and "/resume" in stored.error["message"]
            )
    assert load(session_factory, live.id).status == "running"  # renewed leases are left alone
    with session_factory() as session:
        kinds = [e.kind for e in events.list_events(session, job.id)]
    assert (
        kinds.count("lease_expired") == 3 and kinds.count("requeued") == 2 and kinds[-1] == "failed"
    )


def test_reaper_finishes_an_abandoned_cancel(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    claim(session_factory, job.id, "w1")
    with session_factory.begin() as session:
        jobs.request_cancel(session, row(session, job.id))
    later = utcnow() + timedelta(seconds=LEASE_S + 1)
    assert claim(session_factory, job.id, "w2", now=later) is None  # nothing left to run
    with session_factory.begin() as session:
        assert leases.reap_expired_leases(session, now=later) == ([], [])
    stored = load(session_factory, job.id)
    assert stored.status == "cancelled" and stored.finished_at is not None


def test_concurrent_reapers_requeue_once(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job()
    claim(session_factory, job.id, "w1")
    later = utcnow() + timedelta(seconds=LEASE_S + 1)
    barrier = threading.Barrier(3)
    results: list[list[str]] = []

    def reap() -> None:
        barrier.wait()
        with session_factory.begin() as session:
            results.append(leases.reap_expired_leases(session, now=later)[0])

    threads = [threading.Thread(target=reap) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [[], [], [job.id]]
    assert load(session_factory, job.id).restarts == 1


def test_stale_queued_jobs_are_handed_out_once_per_staleness_period(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    job = make_job(queue="gpu")
    running = make_job(seed=2)
    claim(session_factory, running.id, "w1")
    soon = utcnow() + timedelta(seconds=1)
    with session_factory.begin() as session:
        assert leases.stale_queued_jobs(session, older_than=utcnow() - timedelta(seconds=60)) == []
        assert leases.stale_queued_jobs(session, older_than=soon, now=soon) == [(job.id, "gpu")]
    with session_factory.begin() as session:  # touched: not stale again until older_than passes
        assert leases.stale_queued_jobs(session, older_than=soon) == []
        later = soon + timedelta(seconds=1)
        assert leases.stale_queued_jobs(session, older_than=later) == [(job.id, "gpu")]


def test_two_attempts_lost_without_a_checkpoint_end_as_poison_with_the_cause(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    """Issue 15: lost, lost again without a new checkpoint -> failed, reason poison, whatever
    restarts are left; an attempt that wrote a checkpoint resets the count."""
    job = make_job(max_restarts=10)
    now = utcnow()

    def lose(worker: str, checkpoint_step: int | None = None) -> tuple[list[str], list[str]]:
        nonlocal now
        assert claim(session_factory, job.id, worker, now=now) is not None
        with session_factory.begin() as session:
            if checkpoint_step is not None:
                checkpoints.add_checkpoint(session, job.id, checkpoint_step, "/x", 1, "0" * 64)
            leases.update_progress(session, job.id, {"optimizer_step": 37}, worker_id=worker)
            events.add_event(session, job.id, "oom_backoff", "micro_batch_size 64 -> 32",
                             attempt=row(session, job.id).attempts)
        now += timedelta(seconds=LEASE_S + 1)
        with session_factory.begin() as session:
            return leases.reap_expired_leases(session, now=now)

    assert lose("w1") == ([job.id], [])  # lost once: restarted
    assert lose("w2", checkpoint_step=30) == ([job.id], [])  # lost, but it had progressed
    assert lose("w3") == ([job.id], [])  # lost without progress: the first in a row
    assert lose("w4") == ([], [job.id])  # the second in a row: poison
    stored = load(session_factory, job.id)
    assert stored.status == "failed" and stored.restarts == 3 < stored.max_restarts
    assert stored.error["type"] == "PoisonJob" and stored.error["reason"] == "poison"
    message = stored.error["message"]
    assert "2 attempts in a row died without writing a checkpoint" in message
    assert "at optimizer step 37" in message and "host-w4" in message
    assert "oom_backoff: micro_batch_size 64 -> 32" in message
    assert stored.error["last_event"] == "oom_backoff: micro_batch_size 64 -> 32"


def test_poison_rule_off_and_takeover_refused_for_a_poison_job(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    off, taken = make_job(max_restarts=5), make_job(seed=3, max_restarts=5)
    now = utcnow()
    for attempt in (1, 2, 3):  # poison_after=0: restarts as before
        assert claim(session_factory, off.id, f"w{attempt}", now=now) is not None
        now += timedelta(seconds=LEASE_S + 1)
        with session_factory.begin() as session:
            assert leases.reap_expired_leases(session, now=now, poison_after=0)[0] == [off.id]
    # A worker that finds a job's lease expired takes it over (no reaper involved) once; a
    # second lost attempt without a checkpoint is not taken over again: the reaper fails it.
    assert claim(session_factory, taken.id, "t1", now=now) is not None
    now += timedelta(seconds=LEASE_S + 1)
    assert claim(session_factory, taken.id, "t2", now=now) is not None
    now += timedelta(seconds=LEASE_S + 1)
    assert claim(session_factory, taken.id, "t3", now=now) is None
    with session_factory.begin() as session:
        assert leases.reap_expired_leases(session, now=now)[1] == [taken.id]
    assert load(session_factory, taken.id).error["reason"] == "poison"


def test_a_reaper_given_queues_reaps_only_those(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    """A worker reaps its own queues (with its own settings); the API's reaper, every queue."""
    job = make_job()  # on the default queue
    now = utcnow()
    assert claim(session_factory, job.id, "w1", now=now) is not None
    later = now + timedelta(seconds=LEASE_S + 1)
    with session_factory.begin() as session:
        assert leases.reap_expired_leases(session, now=later, queues=["gpu-a100"]) == ([], [])
    assert load(session_factory, job.id).status == "running"
    with session_factory.begin() as session:
        assert leases.reap_expired_leases(session, now=later, queues=[job.queue]) == ([job.id], [])
    assert load(session_factory, job.id).status == "queued"


def test_run_seconds_add_up_each_attempts_time_a_lost_one_until_its_last_heartbeat(
    session_factory: sessionmaker[Session], make_job: Callable[..., Job]
) -> None:
    """The timeout counts the job's run time over its attempts: a finished attempt adds its
    start-to-end time, a lost one (reaped or taken over) its time until its last renewal, and
    a resume starts the count again."""
    job = make_job()
    start = utcnow()
    with session_factory.begin() as session:
        assert leases.claim_job(session, job.id, "w1", "h", "0", LEASE_S, now=start)
        leases.renew_lease(session, job.id, "w1", LEASE_S, now=start + timedelta(seconds=100))
    # Taken over long after its lease expired: it ran 100 s, not until the takeover.
    taken = start + timedelta(seconds=100 + LEASE_S + 500)
    with session_factory.begin() as session:
        assert leases.claim_job(session, job.id, "w2", "h", "0", LEASE_S, now=taken, poison_after=0)
        leases.renew_lease(session, job.id, "w2", LEASE_S, now=taken + timedelta(seconds=30))
    assert load(session_factory, job.id).run_seconds == pytest.approx(100.0)
    with session_factory.begin() as session:  # reaped: 30 s more
        leases.reap_expired_leases(session, now=taken + timedelta(seconds=30 + LEASE_S + 1),
                                   poison_after=0)
    assert load(session_factory, job.id).run_seconds == pytest.approx(130.0)
    third = taken + timedelta(seconds=1000)
    with session_factory.begin() as session:
        assert leases.claim_job(session, job.id, "w3", "h", "0", LEASE_S, now=third)
        assert leases.finish_job(session, job.id, "w3", "failed", {"type": "X", "message": "x"},
                                 now=third + timedelta(seconds=20))
    assert load(session_factory, job.id).run_seconds == pytest.approx(150.0)
    with session_factory.begin() as session:
        jobs.request_resume(session, row(session, job.id))
    assert load(session_factory, job.id).run_seconds == 0.0
