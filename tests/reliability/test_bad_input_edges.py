"""Job specs and requests at the edges, over HTTP on both database backends: huge N and m,
NaN/inf, deep and 10 MB bodies, unicode, path traversal (data_root and checkpoint downloads),
a data_root outside the allow-list, SQL metacharacters in filters and cursors.

Each row of EDGES is one class of input and says what must happen: refused with a clear 4xx
(problem+json naming the field and, for closed sets, the allowed values) and nothing stored,
or, for input that only looks hostile (unicode names, a name full of SQL), accepted and read
back intact.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from api.conftest import alice, api_settings  # noqa: F401  (fixtures)
from api.helpers import PROBLEM_JSON
from fastapi import FastAPI
from fastapi.testclient import TestClient
from job_specs import MINIMAL_SPEC
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from services.api.main import create_app
from services.jobdb import jobs as store_jobs
from services.jobdb import tokens
from services.jobdb.models import Job, JobEvent
from services.settings import Settings
from services.worker.runner import run_job

MB = 1 << 20
STATUSES = ["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]


@dataclass
class Edge:
    """One class of edge input: the request, and the answer it must get."""

    case: str
    path: str  # `{job}` is alice's job, `{allowed}` / `{outside}` the data directories
    status: int
    spec: dict[str, Any] | None = None  # POST /v1/jobs with this spec (JSON)
    raw: bytes | None = None  # POST /v1/jobs with this body as sent
    chunked: bool = False  # send `raw` without Content-Length
    loc: str | None = None  # the field the 422 must name
    allowed: str | None = None  # "roots" / "statuses": the values the 422 must list
    method: str = "POST"
    extra: dict[str, Any] = field(default_factory=dict)


def spec(**changes: Any) -> dict[str, Any]:
    return {**MINIMAL_SPEC, "optimizer": dict(MINIMAL_SPEC["optimizer"]), **changes}


def mnist(data_root: str) -> dict[str, Any]:
    return spec(dataset={"name": "mnist", "data_root": data_root})


def deep(depth: int) -> bytes:
    return b'{"model": "mlp", "optimizer": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"


def raw_lr(token: str) -> bytes:
    return json.dumps(spec()).replace('"lr": 0.1', f'"lr": {token}').encode()


UNICODE_NAME = "学習 🚀 café ﷽ Ωmega"
SQL_NAME = "x'); DROP TABLE jobs; --"
TRAVERSAL = [
    Edge("data_root_dotdot_escape_refused", "/v1/jobs", 422, mnist("{allowed}/../../etc"),
         loc="body.dataset.data_root", allowed="roots"),
    Edge("data_root_symlink_out_refused", "/v1/jobs", 422, mnist("{allowed}/link-out/mnist"),
         loc="body.dataset.data_root", allowed="roots"),
    Edge("data_root_outside_allow_list_refused", "/v1/jobs", 422, mnist("{outside}"),
         loc="body.dataset.data_root", allowed="roots"),
    Edge("data_root_relative_refused", "/v1/jobs", 422, mnist("data/../../etc"),
         loc="body.dataset.data_root", allowed="roots"),
    Edge("data_root_home_tilde_refused", "/v1/jobs", 422, mnist("~/mnist"),
         loc="body.dataset.data_root", allowed="roots"),
    # A control character in any string of a body (issue 42): refused before the roots are read.
    Edge("data_root_nul_refused", "/v1/jobs", 422, mnist("{allowed}/\x00"), loc="body.dataset.data_root"),
    Edge("checkpoint_step_dotdot_refused", "/v1/jobs/{job}/checkpoints/..%2F..%2F..%2Fsecret.pt",
         404, method="GET"),
    Edge("checkpoint_step_dots_refused", "/v1/jobs/{job}/checkpoints/%2E%2E", 422, method="GET",
         loc="path.step"),
    Edge("checkpoint_job_dotdot_refused", "/v1/jobs/%2E%2E/checkpoints/1", 404, method="GET"),
    Edge("checkpoint_job_encoded_slashes_refused",
         "/v1/jobs/%2E%2E%2F%2E%2E%2Fsecret/checkpoints/1", 404, method="GET"),
]
EDGES = [
    Edge("huge_N_refused", "/v1/jobs", 422, spec(accumulation_steps=2**31),
         loc="body.accumulation_steps"),
    Edge("N_beyond_int64_refused", "/v1/jobs", 422, spec(accumulation_steps=10**30),
         loc="body.accumulation_steps"),
    Edge("huge_m_refused", "/v1/jobs", 422, spec(micro_batch_size=2**40), loc="body.micro_batch_size"),
    Edge("float_m_refused", "/v1/jobs", 422, spec(micro_batch_size=1e300), loc="body.micro_batch_size"),
    Edge("m_x_N_x_gpus_overflow_refused", "/v1/jobs", 422,
         spec(micro_batch_size=2**20, accumulation_steps=65536, gpus=64), loc="body.accumulation_steps"),
    Edge("huge_effective_batch_refused", "/v1/jobs", 422,
         spec(accumulation_steps=None, effective_batch_size=2**40), loc="body.effective_batch_size"),
    Edge("huge_max_steps_refused", "/v1/jobs", 422, spec(epochs=None, max_steps=10**20),
         loc="body.max_steps"),
    Edge("nan_lr_refused", "/v1/jobs", 422, raw=raw_lr("NaN"), loc="body.optimizer.lr"),
    Edge("infinite_lr_refused", "/v1/jobs", 422, raw=raw_lr("Infinity"), loc="body.optimizer.lr"),
    Edge("overflowing_lr_refused", "/v1/jobs", 422, raw=raw_lr("1e999"), loc="body.optimizer.lr"),
    Edge("minus_infinity_clip_refused", "/v1/jobs", 422,
         raw=json.dumps(spec(grad_clip_norm=float("-inf"))).encode(), loc="body.grad_clip_norm"),
    Edge("deeply_nested_body_refused", "/v1/jobs", 400, raw=deep(100_000)),
    Edge("10MB_body_refused", "/v1/jobs", 413,
         raw=json.dumps(spec(name="x" * (10 * MB))).encode()),
    Edge("10MB_chunked_body_refused", "/v1/jobs", 413, raw=b" " * (10 * MB) + b"{}", chunked=True),
    Edge("nul_in_name_refused", "/v1/jobs", 422, spec(name="a\x00b"), loc="body.name"),
    Edge("lone_surrogate_name_refused", "/v1/jobs", 422, raw=b'{"name": "\\ud800"}', loc="body.name"),
    Edge("bidi_override_in_name_refused", "/v1/jobs", 422, spec(name="invoice\u202egpj.exe"),
         loc="body.name"),
    Edge("unicode_queue_refused", "/v1/jobs", 422, spec(queue="défaut"), loc="body.queue"),
    Edge("unicode_name_accepted_intact", "/v1/jobs", 201, spec(name=UNICODE_NAME)),
    Edge("sql_looking_name_accepted_intact", "/v1/jobs", 201, spec(name=SQL_NAME)),
    Edge("data_root_inside_allow_list_accepted", "/v1/jobs", 201, mnist("{allowed}/mnist")),
    Edge("sql_in_status_filter_refused", "/v1/jobs?status=%27%20OR%201%3D1--", 422, method="GET",
         loc="query.status", allowed="statuses"),
    Edge("sql_in_jobs_cursor_refused", "/v1/jobs?cursor=%27%20OR%20%271%27%3D%271", 422,
         method="GET", loc="query.cursor"),
    Edge("sql_in_metrics_cursor_refused", "/v1/jobs/{job}/metrics?cursor=1%3B%20DROP%20TABLE%20jobs",
         422, method="GET", loc="query.cursor"),
    Edge("sql_in_metric_name_refused", "/v1/jobs/{job}/metrics?name=loss%27%20OR%20%271%27%3D%271",
         422, method="GET", loc="query.name"),
    Edge("sql_in_job_id_refused", "/v1/jobs/%27%20OR%20%271%27%3D%271", 404, method="GET"),
    *TRAVERSAL,
]


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    """An allowed data root (with a symlink pointing out of it) and a directory outside it
    holding a secret file that no answer may ever contain."""
    allowed, outside = tmp_path / "datasets", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (outside / "secret.pt").write_bytes(b"TOP-SECRET-CHECKPOINT")
    (allowed / "link-out").symlink_to(outside, target_is_directory=True)
    return {"allowed": allowed, "outside": outside}


@pytest.fixture
def edge_app(api_settings: Settings, dirs: dict[str, Path]) -> FastAPI:  # noqa: F811
    settings = api_settings.model_copy(update={"data_roots": [dirs["allowed"]]})
    return create_app(settings, run_reaper=False)


@pytest.fixture
def edge_client(edge_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(edge_app, raise_server_exceptions=False) as client:
        yield client


def stored_rows(session_factory: sessionmaker[Session]) -> tuple[int, int]:
    with session_factory() as session:
        jobs = session.scalar(select(func.count()).select_from(Job)) or 0
        events = session.scalar(select(func.count()).select_from(JobEvent)) or 0
    return jobs, events


def send(client: TestClient, edge: Edge, headers: dict[str, str], where: dict[str, str]) -> Any:
    path = edge.path.format(**where)
    if edge.method == "GET":
        return client.get(path, headers=headers)
    body = edge.raw if edge.raw is not None else json.dumps(edge.spec).replace(
        "{allowed}", where["allowed"]).replace("{outside}", where["outside"]).encode()
    sent: Any = iter([body[i : i + MB] for i in range(0, len(body), MB)]) if edge.chunked else body
    return client.post(path, content=sent, headers={**headers, "Content-Type": "application/json"})


def check_answer(edge: Edge, response: Any, roots: list[str]) -> None:
    assert response.status_code == edge.status, response.text[:500]
    if edge.status >= 400:
        assert response.headers["content-type"].startswith(PROBLEM_JSON)
        problem = response.json()
        assert problem["status"] == edge.status and problem.get("detail")
        assert "TOP-SECRET" not in response.text
    if edge.loc is not None:
        errors = {e["loc"]: e for e in response.json()["errors"]}
        assert edge.loc in errors, list(errors)
        if edge.allowed == "roots":  # the servers' paths: told to admins only (alice is not)
            assert "allowed" not in errors[edge.loc]
            # (the refused path itself is quoted back, and may start with an allowed root)
            assert "inside one of:" not in errors[edge.loc]["msg"]
            assert "ACCUM_DATA_ROOTS" in errors[edge.loc]["msg"]
        if edge.allowed == "statuses":
            assert errors[edge.loc]["allowed"] == STATUSES


def check_stored(
    edge: Edge, response: Any, client: TestClient, headers: dict[str, str],
    before: tuple[int, int], after: tuple[int, int],
) -> None:
    if edge.status != 201:
        assert after == before, "a refused request stored something"
        return
    assert after == (before[0] + 1, before[1] + 1)  # one job, one `created` event
    assert edge.spec is not None
    created = client.get(f"/v1/jobs/{response.json()['id']}", headers=headers).json()
    assert created["name"] == edge.spec.get("name", created["name"])
    assert created["spec"]["dataset"] == response.json()["spec"]["dataset"]


def test_every_edge_case_is_refused_with_a_clear_4xx_or_accepted_intact(
    edge_client: TestClient,
    alice: dict[str, str],  # noqa: F811
    api_settings: Settings,  # noqa: F811
    session_factory: sessionmaker[Session],
    dirs: dict[str, Path],
    database_backend: str,
    record_figure: Any,
) -> None:
    job = edge_client.post("/v1/jobs", json=spec(), headers=alice).json()["id"]
    roots = [str(dirs["allowed"].resolve())]
    where = {"job": job, "allowed": str(dirs["allowed"]), "outside": str(dirs["outside"])}
    failed: dict[str, str] = {}
    stored_by_refused = 0
    for edge in EDGES:
        before = stored_rows(session_factory)
        response = send(edge_client, edge, alice, where)
        after = stored_rows(session_factory)
        if edge.status != 201:
            stored_by_refused += after[0] - before[0]
        try:
            check_answer(edge, response, roots)
            check_stored(edge, response, edge_client, alice, before, after)
        except AssertionError as exc:
            failed[edge.case] = f"{response.status_code}: {exc}"

    refusals = [e for e in EDGES if e.status != 201]
    refused_ok = sum(e.case not in failed for e in refusals)
    traversal_ok = sum(e.case not in failed for e in TRAVERSAL)
    accepted = [e for e in EDGES if e.status == 201]
    accepted_ok = sum(e.case not in failed for e in accepted)
    if database_backend == "postgresql":  # one figure per key; PostgreSQL is the production store
        record_figure(
            "edge_specs", area="bad input",
            check="Edge job specs and requests (huge N/m, NaN/inf, 10 MB and deep bodies, "
            "unicode, SQL in filters/cursors, data_root outside the allow-list)",
            figure=f"{refused_ok}/{len(refusals)} edge cases refused with a clear 4xx, "
            f"{stored_by_refused} rows stored; {accepted_ok}/{len(accepted)} legitimate "
            "look-alikes (unicode name, SQL-looking name, allowed data_root) accepted intact",
            passed=not failed and stored_by_refused == 0,
        )
        record_figure(
            "path_traversal", area="bad input",
            check="Path traversal: data_root with `..`, a symlink out, relative, `~`, NUL, "
            "outside the allow-list; `../` in checkpoint download paths",
            figure=f"{traversal_ok}/{len(TRAVERSAL)} traversal attempts refused, "
            "0 bytes of the file outside served",
            passed=traversal_ok == len(TRAVERSAL),
        )
    assert failed == {}, "\n".join(f"{case}: {why}" for case, why in failed.items())
    assert stored_by_refused == 0


def test_worker_fails_a_stored_job_whose_data_root_is_outside_the_allow_list(
    api_settings: Settings,  # noqa: F811
    session_factory: sessionmaker[Session],
    dirs: dict[str, Path],
) -> None:
    """Defence in depth: a job that reached the store without the API's check (an older
    allow-list, a direct insert) fails at the worker, with the reason, before reading data."""
    with session_factory.begin() as session:
        owner, _ = tokens.create_owner_with_token(session, "mallory")
        job, _ = store_jobs.create_job(
            session, owner=owner, spec=mnist(str(dirs["allowed"] / ".." / "outside"))
        )
        job_id = job.id

    assert run_job(api_settings, job_id, "edge-worker") == "failed"

    with session_factory() as session:
        failed = store_jobs.load_job(session, job_id)
        assert failed is not None and failed.error is not None
        assert failed.error["type"] == "DataRootNotAllowed"
        assert "outside the allowed data roots" in failed.error["message"]


def test_the_workers_refusal_names_no_server_path_to_the_owner(
    api_settings: Settings,  # noqa: F811
    session_factory: sessionmaker[Session],
    dirs: dict[str, Path],
    caplog: pytest.LogCaptureFixture,
    record_figure: Callable[..., None],
) -> None:
    """The job's error and traceback event are the owner's to read: they say the data_root is
    outside the allowed roots and how to fix it, but name neither the roots nor where a symlink
    leads; the worker's log (its operator's) names both."""
    settings = api_settings.model_copy(update={"data_roots": [dirs["allowed"] / "images", "s3://datasets/public"]})
    with session_factory.begin() as session:
        owner, _ = tokens.create_owner_with_token(session, "mallory")
        job, _ = store_jobs.create_job(session, owner=owner, spec=mnist(str(dirs["allowed"] / "link-out")))
        job_id = job.id

    assert run_job(settings, job_id, "edge-worker") == "failed"

    with session_factory() as session:
        failed = store_jobs.load_job(session, job_id)
        assert failed is not None and failed.error is not None
        shown = [failed.error["message"], *session.scalars(
            select(JobEvent.message).where(JobEvent.job_id == job_id, JobEvent.kind == "traceback"))]
    assert failed.error["type"] == "DataRootNotAllowed" and len(shown) == 2
    for message in shown:
        assert "outside the allowed data roots" in message and "ACCUM_DATA_ROOTS" in message
        for server_path in (str(dirs["outside"]), str(dirs["allowed"] / "images"), "s3://datasets/public"):
            assert server_path not in message, message
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert str(dirs["outside"]) in logged and "s3://datasets/public" in logged
    record_figure(
        "worker_refusal_no_server_path",
        area="bad input",
        check="a stored job whose data_root is a symlink out of the allowed roots, refused by the "
              "worker: its error and traceback event (the owner's) vs the worker's log (the operator's)",
        figure=f"{len(shown)}/2 owner-visible messages name no allowed root and no symlink target; "
               "the worker's log names both",
        passed=True,
    )
