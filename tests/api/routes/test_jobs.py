"""Jobs over HTTP: submit (Location, enqueue after commit, idempotency), list with keyset
pagination and status filter, read one, cancel and resume rules. Both store backends."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.api.main import create_app
from services.jobdb import events, leases
from services.jobdb.models import Job
from services.settings import Settings

from ..helpers import PROBLEM_JSON, claim


def test_submit_returns_201_location_and_the_normalised_job(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any], broker_messages: Any
) -> None:
    response = client.post("/v1/jobs", json=spec, headers=alice)

    assert response.status_code == 201, response.text
    job = response.json()
    assert response.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued" and job["attempts"] == [] and job["error"] is None
    assert job["name"] == "mlp-digits"
    assert job["spec"]["model"]["name"] == "mlp"  # normalised: a name became {"name": ...}
    assert job["spec"]["precision"] == "fp32"  # defaults filled
    assert job["effective_batch_size"] == 16 * 4
    # digits: 1437 training samples -> ceil(ceil(1437 / 16) / 4) optimizer steps per epoch
    assert job["progress"] == {"epoch": 0, "optimizer_step": 0, "total_optimizer_steps": 23}
    assert job["queue"] == "default" and job["worker"] is None
    assert job["started_at"] is None and job["finished_at"] is None
    assert broker_messages() == [job["id"]]  # enqueued once the row was committed


def test_read_one_job_returns_what_was_submitted(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any]
) -> None:
    response = client.get(f"/v1/jobs/{submitted['id']}", headers=alice)

    assert response.status_code == 200
    # The same object, plus the place in line (a count the submit's hot path leaves out).
    assert submitted["queue_position"] is None
    assert response.json() == {**submitted, "queue_position": 1}


def test_unknown_job_is_404_problem(client: TestClient, alice: dict[str, str]) -> None:
    response = client.get("/v1/jobs/nope", headers=alice)

    assert response.status_code == 404
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    assert "nope" in response.json()["detail"]


def test_same_idempotency_key_and_body_returns_the_same_job_once(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any], broker_messages: Any
) -> None:
    headers = {**alice, "Idempotency-Key": "run-42"}
    first = client.post("/v1/jobs", json=spec, headers=headers)
    # The same spec written differently (a default spelled out) is the same body.
    again = client.post("/v1/jobs", json={**spec, "precision": "fp32"}, headers=headers)

    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Location"] == first.headers["Location"]
    assert broker_messages() == [first.json()["id"]]  # the replay enqueues nothing


def test_same_idempotency_key_with_another_body_is_409(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    headers = {**alice, "Idempotency-Key": "run-42"}
    first = client.post("/v1/jobs", json=spec, headers=headers)
    other = client.post("/v1/jobs", json={**spec, "seed": 7}, headers=headers)

    assert other.status_code == 409
    assert other.headers["content-type"].startswith(PROBLEM_JSON)
    assert first.json()["id"] in other.json()["detail"]


def test_idempotency_keys_are_per_owner(
    client: TestClient, alice: dict[str, str], bob: dict[str, str], spec: dict[str, Any]
) -> None:
    a = client.post("/v1/jobs", json=spec, headers={**alice, "Idempotency-Key": "k"})
    b = client.post("/v1/jobs", json=spec, headers={**bob, "Idempotency-Key": "k"})

    assert a.status_code == b.status_code == 201
    assert a.json()["id"] != b.json()["id"]


def test_list_pages_newest_first_with_keyset_cursor(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    ids = [
        client.post("/v1/jobs", json={**spec, "seed": i}, headers=alice).json()["id"]
        for i in range(5)
    ]
    seen, cursor, pages = [], None, 0
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=params, headers=alice).json()
        seen += [j["id"] for j in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert seen == ids[::-1]
    assert pages == 3


def test_list_filters_by_status(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    kept = client.post("/v1/jobs", json=spec, headers=alice).json()["id"]
    gone = client.post("/v1/jobs", json={**spec, "seed": 1}, headers=alice).json()["id"]
    client.post(f"/v1/jobs/{gone}/cancel", headers=alice)

    queued = client.get("/v1/jobs", params={"status": "queued"}, headers=alice).json()
    cancelled = client.get("/v1/jobs", params={"status": "cancelled"}, headers=alice).json()

    assert [j["id"] for j in queued["items"]] == [kept]
    assert [j["id"] for j in cancelled["items"]] == [gone]


def test_cancel_a_queued_job_is_immediate_and_final(
    client: TestClient,
    alice: dict[str, str],
    submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    response = client.post(f"/v1/jobs/{job_id}/cancel", headers=alice)

    assert response.status_code == 202
    assert response.json()["status"] == "cancelled"
    assert response.json()["finished_at"] is not None
    # A worker that receives the (already sent) message cannot claim it: the job never starts.
    assert claim(session_factory, job_id) is None
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).json()["status"] == "cancelled"
    again = client.post(f"/v1/jobs/{job_id}/cancel", headers=alice)
    assert again.status_code == 409
    assert "cancelled" in again.json()["detail"]


def test_cancel_a_running_job_asks_its_worker(
    client: TestClient,
    alice: dict[str, str],
    submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    assert claim(session_factory, job_id, host="gpu-node-1", gpu="H100")

    running = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    response = client.post(f"/v1/jobs/{job_id}/cancel", headers=alice)

    assert running["status"] == "running" and [a["attempt"] for a in running["attempts"]] == [1]
    assert running["worker"] == {"name": None, "host": "gpu-node-1", "gpu": "H100"}
    assert running["started_at"] is not None
    assert response.status_code == 202
    assert response.json()["status"] == "cancelling"
    with session_factory() as session:
        kinds = [e.kind for e in events.list_events(session, job_id)]
    assert kinds[-1] == "cancel_requested"


def test_resume_requeues_a_cancelled_job_and_enqueues_it(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], broker_messages: Any
) -> None:
    job_id = submitted["id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=alice)

    response = client.post(f"/v1/jobs/{job_id}/resume", headers=alice)

    assert response.status_code == 202
    assert response.json()["status"] == "queued"
    assert response.json()["finished_at"] is None
    assert broker_messages() == [job_id, job_id]


def test_resume_of_a_queued_or_running_job_is_409(
    client: TestClient,
    alice: dict[str, str],
    submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    queued = client.post(f"/v1/jobs/{job_id}/resume", headers=alice)
    claim(session_factory, job_id)
    running = client.post(f"/v1/jobs/{job_id}/resume", headers=alice)

    assert queued.status_code == running.status_code == 409
    assert "failed or cancelled" in running.json()["detail"]
    with session_factory() as session:
        assert session.get(Job, job_id).status == "running"  # type: ignore[union-attr]


def test_a_failed_job_shows_its_error_and_resume_clears_it(
    client: TestClient,
    alice: dict[str, str],
    submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    claim(session_factory, job_id)
    with session_factory.begin() as session:
        error = {"type": "DatasetUnavailable", "message": "no data under /data/cifar10"}
        assert leases.finish_job(session, job_id, "w1", "failed", error=error)

    failed = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    resumed = client.post(f"/v1/jobs/{job_id}/resume", headers=alice)

    assert failed["status"] == "failed" and failed["finished_at"] is not None
    assert failed["error"] == {
        "type": "DatasetUnavailable", "message": "no data under /data/cifar10", "reason": None,
        "nonfinite": None,
    }
    assert resumed.status_code == 202
    assert resumed.json()["status"] == "queued" and resumed.json()["error"] is None


def test_a_broker_outage_does_not_lose_the_submitted_job(
    api_settings: Settings, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    # The row is committed before the broker is tried: the job exists and stays queued
    # (and /readyz reports the broker down) instead of the client getting a 500 for a job
    # that was in fact created.
    settings = api_settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(settings, run_reaper=False), raise_server_exceptions=False) as client:
        created = client.post("/v1/jobs", json=spec, headers=alice)
        listed = client.get("/v1/jobs", headers=alice).json()["items"]

    assert created.status_code == 201, created.text
    assert [(j["id"], j["status"]) for j in listed] == [(created.json()["id"], "queued")]


def test_read_one_job_carries_its_exactness_check(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    job_id = submitted["id"]
    assert submitted["exactness"] == {"status": "not_checked", "checked": False, "rel_error": None, "tolerance": None,
                                      "passed": None, "note": "not checked yet"}
    # What the worker's store callback writes for accumcore's exactness_check event.
    message = "first window = big batch: relative error 3.1e-08 (tolerance 1e-06; W = 64 items)"
    with session_factory.begin() as session:
        events.add_event(session, job_id, "exactness_check", message,
                         {"rel_error": 3.1e-8, "tolerance": 1e-6, "passed": True, "items": 64.0})
    job = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert job["exactness"] == {"status": "passed", "checked": True, "rel_error": 3.1e-8, "tolerance": 1e-6,
                                "passed": True, "note": message}
    # A later attempt's check is the one shown; an infinite error is answered as null.
    with session_factory.begin() as session:
        events.add_event(session, job_id, "exactness_check", "first window != big batch",
                         {"rel_error": "inf", "tolerance": 1e-6, "passed": False})
    job = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert job["exactness"]["passed"] is False and job["exactness"]["rel_error"] is None
    assert job["exactness"]["note"] == "first window != big batch" and job["exactness"]["status"] == "failed"
    # Compared only where nothing could differ (issue 28): pending, never passed.
    pending = "exactness check pending: fewer than two parts with items"
    with session_factory.begin() as session:
        events.add_event(session, job_id, "exactness_check", pending,
                         {"rel_error": 0.0, "tolerance": 1e-6, "passed": None, "status": "pending"})
    job = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert job["exactness"] == {"status": "pending", "checked": False, "rel_error": 0.0, "tolerance": 1e-6,
                                "passed": None, "note": pending}
    # Listings leave it out (one query per page, not per job).
    listed = client.get("/v1/jobs", headers=alice).json()["items"]
    assert [j["exactness"] for j in listed] == [None]


def test_a_skipped_check_and_verify_window_false_say_so(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any],
    session_factory: sessionmaker[Session],
) -> None:
    off = client.post("/v1/jobs", json={**spec, "verify_window": False}, headers=alice).json()
    assert off["spec"]["verify_window"] is False
    assert off["exactness"]["checked"] is False
    assert off["exactness"]["note"] == "verify_window is false: not checked"
    on = client.post("/v1/jobs", json={**spec, "verify_window": "warn"}, headers=alice).json()
    skipped = "exactness check not run: skipped: the micro-batches cannot be concatenated"
    with session_factory.begin() as session:
        events.add_event(session, on["id"], "exactness_check", skipped,
                         {"rel_error": None, "tolerance": 1e-6, "passed": None})
    job = client.get(f"/v1/jobs/{on['id']}", headers=alice).json()
    assert job["exactness"] == {"status": "not_checked", "checked": False, "rel_error": None, "tolerance": 1e-6,
                                "passed": None, "note": skipped}


def test_a_bad_verify_window_is_422_with_the_allowed_values(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    response = client.post("/v1/jobs", json={**spec, "verify_window": "sometimes"}, headers=alice)
    assert response.status_code == 422
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    [error] = response.json()["errors"]
    assert error["loc"] == "body.verify_window" and error["allowed"] == [True, False, "warn", "strict"]


def test_an_s3_data_root_is_accepted_under_a_listed_s3_root_only(
    api_settings: Settings, alice: dict[str, str], admin: dict[str, str], spec: dict[str, Any],
    tmp_path: Any,
) -> None:
    """An s3:// data_root outside ACCUM_DATA_ROOTS (another bucket the workers could read) is
    422 at submit: a worker would sync it otherwise."""
    roots = [tmp_path / "datasets", "s3://datasets/public"]
    app = create_app(api_settings.model_copy(update={"data_roots": roots}), run_reaper=False)
    def at(url: str) -> dict[str, Any]:
        return {**spec, "dataset": {"name": "mnist", "data_root": url}}
    with TestClient(app) as client:
        refused = client.post("/v1/jobs", json=at("s3://checkpoints/alice"), headers=alice)
        for_admin = client.post("/v1/jobs", json=at("s3://checkpoints/alice"), headers=admin)
        accepted = client.post("/v1/jobs", json=at("s3://datasets/public/mnist"), headers=alice)
    [error] = refused.json()["errors"]
    assert error["loc"] == "body.dataset.data_root" and "outside the allowed data roots" in error["msg"]
    assert "s3://datasets/public" not in refused.text and "allowed" not in error
    assert "s3://datasets/public" in for_admin.json()["errors"][0]["allowed"]
    assert accepted.status_code == 201, accepted.text


def test_data_root_refusal_names_the_roots_to_admins_only(
    api_settings: Settings,
    session_factory: sessionmaker[Session],
    alice: dict[str, str],
    admin: dict[str, str],
    spec: dict[str, Any],
    tmp_path: Any,
) -> None:
    """ACCUM_DATA_ROOTS is the one allow-list; its paths are the servers', shown to admins."""
    roots = [tmp_path / "datasets", tmp_path / "shared"]
    app = create_app(api_settings.model_copy(update={"data_roots": roots}), run_reaper=False)
    outside = {**spec, "dataset": {"name": "mnist", "data_root": str(tmp_path / "etc")}}
    inside = {**spec, "dataset": {"name": "mnist", "data_root": str(roots[1] / "mnist")}}
    with TestClient(app) as client:
        owner_error = client.post("/v1/jobs", json=outside, headers=alice).json()["errors"][0]
        admin_error = client.post("/v1/jobs", json=outside, headers=admin).json()["errors"][0]
        accepted = client.post("/v1/jobs", json=inside, headers=alice)
    assert owner_error["loc"] == admin_error["loc"] == "body.dataset.data_root"
    assert "allowed" not in owner_error and str(tmp_path) not in owner_error["msg"].replace(
        str(tmp_path / "etc"), ""
    )
    assert "ACCUM_DATA_ROOTS" in owner_error["msg"]
    assert admin_error["allowed"] == [str(r.resolve()) for r in roots]
    assert all(str(r.resolve()) in admin_error["msg"] for r in roots)
    assert accepted.status_code == 201, accepted.text
