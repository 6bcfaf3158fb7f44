"""The catalog over HTTP: every model and dataset of services.catalog, with compatibility."""

from __future__ import annotations

from fastapi.testclient import TestClient

from services.catalog import DATASETS, MODELS, OWN_DATASETS, check_compatible, compatible_datasets


def test_models_list_every_catalog_model_with_its_compatible_datasets(
    client: TestClient, alice: dict[str, str]
) -> None:
    items = client.get("/v1/catalog/models", headers=alice).json()["items"]

    # The catalog, then the timm: and hf: namespaces, then installed plugins.
    assert [m["name"] for m in items][: len(MODELS) + 2] == [*MODELS, "timm:", "hf:"]
    assert {m["source"] for m in items[len(MODELS) + 2:]} <= {"plugin"}
    mlp = next(m for m in items if m["name"] == "mlp")
    assert mlp["description"] == MODELS["mlp"].description
    # Own data by any column mapping that fits the model: files and hf_disk with features and
    # a label train an mlp (the README's CSV job), though their default mapping (text) does not.
    features = {"columns": {"features": ["x", "y"], "label": "label"}}
    as_files = {"data_files": "train.csv", **features}
    assert mlp["compatible_datasets"] == sorted(
        d for d in [*DATASETS, *OWN_DATASETS] if check_compatible("mlp", d) is None
        or d in ("files", "hf_disk")
        and check_compatible("mlp", d, as_files if d == "files" else features) is None)
    assert {"files", "hf_disk"} <= set(mlp["compatible_datasets"])
    assert mlp["compatible_datasets"] == compatible_datasets("mlp")


def test_datasets_list_sizes_and_compatible_models(client: TestClient, alice: dict[str, str]) -> None:
    items = client.get("/v1/catalog/datasets", headers=alice).json()["items"]

    assert [d["name"] for d in items][: len(DATASETS) + len(OWN_DATASETS)] == [*DATASETS, *OWN_DATASETS]
    digits = next(d for d in items if d["name"] == "digits")
    assert digits["train_size"] == DATASETS["digits"].train_size
    assert "mlp" in digits["compatible_models"]


def test_installed_plugins_are_listed_with_their_entry_points(client: TestClient, alice: dict[str, str]) -> None:
    from tests.own_data_files import ensure_example_plugin

    ensure_example_plugin()
    models = {m["name"]: m for m in client.get("/v1/catalog/models", headers=alice).json()["items"]}
    assert models["example_mlp"]["source"] == "plugin"
    assert models["example_mlp"]["entry_point"] == "accum_plugin_example.models:example_mlp"
    datasets = {d["name"]: d for d in client.get("/v1/catalog/datasets", headers=alice).json()["items"]}
    assert datasets["example_blobs"]["source"] == "plugin"
