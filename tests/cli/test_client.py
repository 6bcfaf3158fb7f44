"""The typed client against a real API server: every endpoint, pagination, downloads, errors."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import pytest

from accum import AccumAPIError, AccumClient, parse_sse


def test_submit_returns_the_normalised_job(client: AccumClient, tiny_spec: dict[str, Any]) -> None:
    job = client.submit(tiny_spec)
    assert job["status"] == "queued"
    assert job["effective_batch_size"] == tiny_spec["micro_batch_size"] * tiny_spec["accumulation_steps"]
    assert client.job(job["id"])["spec"]["optimizer"]["name"] == "sgd"


def test_idempotency_key_returns_the_same_job(client: AccumClient, tiny_spec: dict[str, Any]) -> None:
    key = uuid.uuid4().hex
    first = client.submit(tiny_spec, idempotency_key=key)
    again = client.submit(tiny_spec, idempotency_key=key)
    assert again["id"] == first["id"]
    with pytest.raises(AccumAPIError) as conflict:
        client.submit({**tiny_spec, "epochs": 2}, idempotency_key=key)
    assert conflict.value.status == 409


def test_all_jobs_follows_every_page(client: AccumClient, tiny_spec: dict[str, Any]) -> None:
    ids = {client.submit({**tiny_spec, "name": f"page-{i}"})["id"] for i in range(3)}
    first_page = client.jobs(limit=2)
    assert len(first_page["items"]) == 2 and first_page["next_cursor"]
    listed = [j["id"] for j in client.all_jobs()]
    assert ids <= set(listed)
    assert len(listed) == len(set(listed)), "a job appears on two pages"


def test_cancel_a_queued_job_then_resume_it(client: AccumClient, tiny_spec: dict[str, Any]) -> None:
    job = client.submit(tiny_spec)
    client.cancel(job["id"])
    assert client.job(job["id"])["status"] == "cancelled"
    with pytest.raises(AccumAPIError) as finished:
        client.cancel(job["id"])
    assert finished.value.status == 409
    client.resume(job["id"])
    assert client.job(job["id"])["status"] == "queued"
    kinds = [e["kind"] for e in client.events(job["id"])]
    assert {"created", "cancelled", "resumed"} <= set(kinds)


def test_metrics_are_read_across_pages(
    client: AccumClient, seed: Any, tiny_spec: dict[str, Any]
) -> None:
    job = client.submit(tiny_spec)
    seed.metrics(job["id"], steps=25, names=("loss", "lr"))
    points = client.metrics(job["id"], name="loss", page_size=10)
    assert [p["step"] for p in points] == list(range(1, 26))
    assert points[4]["value"] == pytest.approx(1 / 5)
    assert {p["name"] for p in client.metrics(job["id"])} == {"loss", "lr"}


def test_download_verifies_sha256(
    client: AccumClient, seed: Any, tiny_spec: dict[str, Any], tmp_path: Path
) -> None:
    job = client.submit(tiny_spec)
    content = uuid.uuid4().bytes * 1000
    seed.checkpoint(job["id"], 10, b"older")
    seed.checkpoint(job["id"], 20, content)
    assert sorted(c["step"] for c in client.checkpoints(job["id"])) == [10, 20]
    saved = client.download(job["id"], path=tmp_path)  # latest step by default
    assert saved == tmp_path / f"{job['id']}-20.pt"
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == hashlib.sha256(content).hexdigest()
    assert client.download(job["id"], 10, tmp_path / "ten.pt").read_bytes() == b"older"


def test_download_refuses_a_corrupted_file(
    client: AccumClient, seed: Any, tiny_spec: dict[str, Any], tmp_path: Path
) -> None:
    job = client.submit(tiny_spec)
    seed.checkpoint(job["id"], 5, b"real bytes", sha256="0" * 64)
    target = tmp_path / "model.pt"
    with pytest.raises(AccumAPIError, match="sha256"):
        client.download(job["id"], 5, target)
    assert not target.exists() and not list(tmp_path.iterdir()), "no partial file is left"


def test_download_merged_streams_a_lora_jobs_tar_and_verifies_it(
    client: AccumClient, seed: Any, tiny_spec: dict[str, Any], tmp_path: Path
) -> None:
    from services.artifacts import merged_key, open_store

    job = client.submit(tiny_spec)
    with pytest.raises(AccumAPIError) as missing:
        client.download_merged(job["id"], tmp_path)
    assert missing.value.status == 404 and "no peft.merge" in str(missing.value)
    packed = tmp_path / "made.tar"
    packed.write_bytes(uuid.uuid4().bytes * 100)  # the route serves the object's bytes as stored
    note = tmp_path / "made.tar.sha256"  # its hash beside it, as the worker stores it
    note.write_text(hashlib.sha256(packed.read_bytes()).hexdigest())
    store = open_store(seed.settings.artifacts_url)
    store.put(merged_key(job["id"]), packed)
    store.put(merged_key(job["id"]) + ".sha256", note)
    saved = client.download_merged(job["id"], tmp_path / "out")  # a file name, not a folder
    assert saved == tmp_path / "out" and saved.read_bytes() == packed.read_bytes()


def test_stream_of_a_finished_job_ends(client: AccumClient, tiny_spec: dict[str, Any]) -> None:
    job = client.submit(tiny_spec)
    client.cancel(job["id"])
    messages = list(client.stream_events(job["id"]))
    assert messages[-1] == ("end", {"status": "cancelled"})
    kinds = [data["kind"] for event, data in messages if event == "job_event"]
    assert "created" in kinds and "cancelled" in kinds


def test_catalog_lists_models_and_datasets(client: AccumClient) -> None:
    models = {m["name"] for m in client.catalog("models")}
    datasets = {d["name"] for d in client.catalog("datasets")}
    assert {"mlp", "small_cnn"} <= models and "digits" in datasets


def test_bad_spec_error_names_the_field(client: AccumClient, tiny_spec: dict[str, Any]) -> None:
    with pytest.raises(AccumAPIError) as bad:
        client.submit({**tiny_spec, "micro_batch_size": 0})
    error = bad.value
    assert error.status == 422
    assert "micro_batch_size" in str(error)
    assert "\n" not in str(error)


def test_unknown_job_and_bad_token_are_clear(api_server: Any) -> None:
    with AccumClient(api_server.url, api_server.token) as c, pytest.raises(AccumAPIError) as missing:
        c.job("no-such-job")
    assert missing.value.status == 404
    with AccumClient(api_server.url, "wrong") as c, pytest.raises(AccumAPIError) as denied:
        c.jobs()
    assert denied.value.status == 401


def test_unreachable_server_says_how_to_start_one() -> None:
    with AccumClient("http://127.0.0.1:9", "t") as c, pytest.raises(AccumAPIError) as down:
        c.jobs()
    assert down.value.status == 0 and "accum up" in str(down.value)


def test_sse_parser_follows_the_framing() -> None:
    lines = [
        ": keep-alive",
        "event: metric",
        'data: {"name": "loss",',
        'data: "step": 3}',
        "",
        "event: end",
        'data: {"status": "succeeded"}',
        "",
    ]
    assert list(parse_sse(iter(lines))) == [
        ("metric", {"name": "loss", "step": 3}),
        ("end", {"status": "succeeded"}),
    ]


def test_job_takes_the_short_id_lists_show(client: AccumClient, tiny_spec: dict[str, Any]) -> None:
    first, second = client.submit(tiny_spec), client.submit(tiny_spec)
    assert client.job(first["id"][:12])["id"] == first["id"]
    common = next(i for i in range(26) if first["id"][i] != second["id"][i])
    with pytest.raises(AccumAPIError) as ambiguous:
        client.job(first["id"][:common])
    assert ambiguous.value.status == 422
    assert "ambiguous" in str(ambiguous.value) and second["id"] in str(ambiguous.value)


def test_a_client_without_arguments_reads_the_clis_configuration(
    api_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_spec: dict[str, Any]
) -> None:
    from accum.config import write_local_config

    for key in ("ACCUM_URL", "ACCUM_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("ACCUM_HOME", str(tmp_path))
    write_local_config(api_server.url, api_server.token, tmp_path)  # what `accum up` writes
    with AccumClient() as client:
        assert client.url == api_server.url and client.me()["name"] == "cli-tests"
    monkeypatch.setenv("ACCUM_TOKEN", "accum_not-a-token")  # the environment wins
    with AccumClient() as client, pytest.raises(AccumAPIError) as refused:
        client.me()
    assert refused.value.status == 401


def test_wait_returns_the_finished_job_or_times_out_saying_where_it_is(
    client: AccumClient, tiny_spec: dict[str, Any]
) -> None:
    job = client.submit(tiny_spec)  # no worker here: it stays queued
    with pytest.raises(TimeoutError, match=r"still queued \(step 0\) after 0.3 s"):
        client.wait(job["id"], timeout=0.3, poll_s=0.1)
    client.cancel(job["id"])
    assert client.wait(job["id"], timeout=30)["status"] == "cancelled"
