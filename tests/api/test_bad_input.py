"""Every kind of bad input from issue 3, through HTTP: 422 naming the field path (and the
allowed values for closed sets), 400 for malformed JSON, 413 over 1 MiB, 404 for unknown ids."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from job_specs import MINIMAL_SPEC

from services.api.main import create_app
from services.catalog import DATASETS, MODELS, served_names
from services.settings import Settings

from .helpers import PROBLEM_JSON, field_error

DROP = object()  # a change that removes the field


def with_changes(**changes: Any) -> dict[str, Any]:
    spec = {**MINIMAL_SPEC, **changes}
    return {k: v for k, v in spec.items() if v is not DROP}


# (case, spec, dotted field path, text the message must contain). One test walks the whole
# table (an app per case would cost more than the cases themselves).
BAD_SPECS = [
    ("m=0", with_changes(micro_batch_size=0), "body.micro_batch_size", "from 1"),
    ("m<0", with_changes(micro_batch_size=-4), "body.micro_batch_size", "from 1"),
    ("N=0", with_changes(accumulation_steps=0), "body.accumulation_steps", "from 1 to 65536"),
    ("N>65536", with_changes(accumulation_steps=65537), "body.accumulation_steps", "from 1 to 65536"),
    ("N-and-B", with_changes(effective_batch_size=64), "body.effective_batch_size", "not both"),
    ("neither-N-nor-B", with_changes(accumulation_steps=DROP), "body.effective_batch_size", "give accumulation_steps"),
    ("epochs=0", with_changes(epochs=0), "body.epochs", "must be an integer from 1 to 10,000; got 0"),
    ("epochs<0", with_changes(epochs=-1), "body.epochs", "from 1 to 10,000; got -1"),
    ("lr=0", with_changes(optimizer={"name": "sgd", "lr": 0}), "body.optimizer.lr", "must be a number greater than 0 and at most 10; got 0"),
    ("lr<0", with_changes(optimizer={"name": "sgd", "lr": -0.1}), "body.optimizer.lr", "greater than 0"),
    ("unknown-field", with_changes(surprise=1), "body.surprise", "unknown field 'surprise'; one of: name"),
    ("unknown-nested-field", with_changes(optimizer={"name": "sgd", "lr": 0.1, "nesterov": True}), "body.optimizer.nesterov", ""),
    # Issue 15: every size has a maximum, named in the error.
    ("lr=1e308", with_changes(optimizer={"name": "sgd", "lr": 1e308}), "body.optimizer.lr", "greater than 0 and at most 10; got 1e+308"),
    ("fake-size=1e30", with_changes(dataset={"name": "fake", "size": 10**30}), "body.dataset", "from 1 to 10000000"),
    ("fake-image=1e6", with_changes(dataset={"name": "fake", "image_size": 10**6}), "body.dataset", "from 1 to 1024"),
    ("text-max_len=1e9", with_changes(model="tiny_transformer", dataset={"name": "text", "max_len": 10**9}), "body.dataset", "from 2 to 4096"),
    ("mlp-1e12x1e6", with_changes(model={"name": "mlp", "hidden": 10**12, "depth": 10**6}), "body.model", "from 1 to 65536"),
    ("epochs=1e6", with_changes(epochs=10**6), "body.epochs", "from 1 to 10,000; got 1000000"),
    ("max_steps=1e9", with_changes(epochs=DROP, max_steps=10**9), "body.max_steps", "from 1 to 100,000,000"),
    ("keep=101", with_changes(keep_checkpoints=101), "body.keep_checkpoints", "from 1 to 100; got 101"),
    ("restarts=11", with_changes(max_restarts=11), "body.max_restarts", "at most 10 on this service"),
    ("gpus=9", with_changes(gpus=9), "body.gpus", "at most 8 on this service"),
    ("gpus=65", with_changes(gpus=65), "body.gpus", "from 0 to 64; got 65"),
    ("too-many-steps", with_changes(dataset={"name": "fake", "size": 10**7}, micro_batch_size=1, accumulation_steps=1, epochs=100), "body.epochs", "at most 100,000,000"),
    ("model-too-large", with_changes(model={"name": "mlp", "hidden": 65536, "depth": 64}), "body.model", "cannot fit on one device"),
    ("batch-too-large", with_changes(model="vit_l_16", dataset={"name": "fake", "image_size": 1024, "size": 4096}, micro_batch_size=1024), "body.micro_batch_size", "cannot fit on one device"),
]


def test_invalid_spec_is_422_at_its_field(client: TestClient, alice: dict[str, str]) -> None:
    for case, spec, loc, says in BAD_SPECS:
        response = client.post("/v1/jobs", json=spec, headers=alice)

        error = field_error(response, loc)
        assert says in error["msg"], case
        assert loc in response.json()["detail"], case


def test_nothing_is_stored_for_a_spec_over_a_limit(
    client: TestClient, alice: dict[str, str]
) -> None:
    for case, spec, _loc, _ in BAD_SPECS[-4:]:
        assert client.post("/v1/jobs", json=spec, headers=alice).status_code == 422, case
    assert client.get("/v1/jobs", headers=alice).json()["items"] == []


def test_checkpoint_every_below_the_stores_floor_is_422_naming_the_floor(
    api_settings: Settings, alice: dict[str, str]
) -> None:
    app = create_app(api_settings.model_copy(update={"min_checkpoint_every": 20}), run_reaper=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        error = field_error(client.post("/v1/jobs", json=with_changes(checkpoint_every=19), headers=alice),
                            "body.checkpoint_every")
        assert "at least 20" in error["msg"] and "ACCUM_MIN_CHECKPOINT_EVERY" in error["msg"]
        assert client.get("/v1/jobs", headers=alice).json()["items"] == []
        accepted = client.post("/v1/jobs", json=with_changes(checkpoint_every=20), headers=alice)
        assert accepted.status_code == 201, accepted.text


def test_unknown_names_list_the_allowed_values(client: TestClient, alice: dict[str, str]) -> None:
    cases = [
        # The catalog's names, then the namespaces, your own data and the plugins served here.
        (with_changes(model="resnet9000"), "body.model", served_names("model")),
        (with_changes(dataset="imagenet22k"), "body.dataset", served_names("dataset")),
        (with_changes(optimizer={"name": "rmsprop", "lr": 0.1}), "body.optimizer.name", ["sgd", "adamw", "adamw8bit"]),
        (with_changes(precision="fp8"), "body.precision", ["fp32", "bf16", "fp16"]),
    ]
    for spec, loc, allowed in cases:
        error = field_error(client.post("/v1/jobs", json=spec, headers=alice), loc)

        assert sorted(error["allowed"]) == sorted(allowed), loc


def test_a_misspelt_field_names_the_one_meant(client: TestClient, alice: dict[str, str]) -> None:
    spec = with_changes(epochz=2, optimizer={"name": "sgd", "lrr": 0.1, "lr": 0.1})
    response = client.post("/v1/jobs", json=spec, headers=alice)
    top, nested = field_error(response, "body.epochz"), field_error(response, "body.optimizer.lrr")
    assert top["msg"] == "unknown field 'epochz'; did you mean epochs?"
    assert "epochs" in top["allowed"] and "micro_batch_size" in top["allowed"]
    assert nested["msg"] == "unknown field 'lrr'; did you mean lr?"
    assert set(nested["allowed"]) == {"name", "lr", "momentum", "weight_decay", "betas"}
    # Another route's body is walked by its own model.
    job = client.post("/v1/jobs", json=MINIMAL_SPEC, headers=alice).json()
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=alice)
    resumed = client.post(f"/v1/jobs/{job['id']}/resume", json={"from_stepp": 1}, headers=alice)
    assert field_error(resumed, "body.from_stepp")["msg"] == "unknown field 'from_stepp'; did you mean from_step?"


def test_effective_batch_not_divisible_lists_the_micro_batches_that_divide_it(
    client: TestClient, alice: dict[str, str]
) -> None:
    spec = with_changes(accumulation_steps=DROP, effective_batch_size=60)

    error = field_error(client.post("/v1/jobs", json=spec, headers=alice), "body.effective_batch_size")

    assert "not divisible" in error["msg"]
    assert error["allowed"] == [d for d in range(1, 61) if 60 % d == 0]


def test_incompatible_model_and_dataset_names_the_datasets_that_work(
    client: TestClient, alice: dict[str, str]
) -> None:
    mlp_task = MODELS["mlp"].task
    other = next(name for name, info in DATASETS.items() if info.task != mlp_task)

    error = field_error(client.post("/v1/jobs", json=with_changes(dataset=other), headers=alice), "body.dataset")

    assert "'mlp'" in error["msg"] and repr(other) in error["msg"]
    assert "digits" in error["allowed"]


def test_non_finite_learning_rate_is_refused(client: TestClient, alice: dict[str, str]) -> None:
    for lr in (b"Infinity", b"NaN", b"1e999", b'"inf"'):
        body = (
            b'{"model": "mlp", "dataset": "digits", "micro_batch_size": 16, "accumulation_steps": 4,'
            b' "epochs": 1, "optimizer": {"name": "sgd", "lr": ' + lr + b"}}"
        )
        response = client.post(
            "/v1/jobs", content=body, headers={**alice, "Content-Type": "application/json"}
        )

        assert response.status_code in (400, 422), (lr, response.text)
        assert response.headers["content-type"].startswith(PROBLEM_JSON)
        if response.status_code == 422:
            field_error(response, "body.optimizer.lr")


def test_malformed_json_is_400(client: TestClient, alice: dict[str, str]) -> None:
    for body in (b"{", b'{"model": "mlp",}', b"not json", b"\xff\xfe"):
        response = client.post(
            "/v1/jobs", content=body, headers={**alice, "Content-Type": "application/json"}
        )

        assert response.status_code == 400, (body, response.text)
        assert response.headers["content-type"].startswith(PROBLEM_JSON)
        assert "JSON" in response.json()["detail"]


def test_body_over_one_mebibyte_is_413(client: TestClient, alice: dict[str, str]) -> None:
    padding = "x" * (1024 * 1024)
    response = client.post("/v1/jobs", json={**MINIMAL_SPEC, "name": padding}, headers=alice)

    assert response.status_code == 413
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    assert response.json()["max_body_bytes"] == 1024 * 1024


def test_bad_list_parameters_are_422_at_their_name(client: TestClient, alice: dict[str, str]) -> None:
    statuses = ["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]
    cases: list[tuple[dict[str, Any], str, list[str] | None]] = [
        ({"status": "done"}, "query.status", statuses),
        ({"limit": 0}, "query.limit", None),
        ({"limit": "ten"}, "query.limit", None),
        ({"cursor": "not-a-cursor"}, "query.cursor", None),
    ]
    for params, loc, allowed in cases:
        error = field_error(client.get("/v1/jobs", params=params, headers=alice), loc)

        assert error.get("allowed") == allowed, params


def test_unknown_job_id_is_404_everywhere(client: TestClient, alice: dict[str, str]) -> None:
    unknown = "01hzzzzzzzzzzzzzzzzzzzzzzz"  # well-formed, never created
    for method, path in [
        ("GET", "/v1/jobs/{id}"),
        ("POST", "/v1/jobs/{id}/cancel"),
        ("POST", "/v1/jobs/{id}/resume"),
        ("GET", "/v1/jobs/{id}/metrics"),
        ("GET", "/v1/jobs/{id}/events"),
        ("GET", "/v1/jobs/{id}/checkpoints"),
        ("GET", "/v1/jobs/{id}/checkpoints/5"),
        ("GET", "/v1/jobs/not-an-id"),
    ]:
        response = client.request(method, path.format(id=unknown), headers=alice)

        assert response.status_code == 404, (method, path)
        assert response.headers["content-type"].startswith(PROBLEM_JSON)
