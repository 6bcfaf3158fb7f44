"""The catalog over HTTP: every model and dataset of services.catalog, with compatibility."""

from __future__ import annotations

from fastapi.testclient import TestClient

from services.catalog import DATASETS, MODELS, check_compatible


def test_models_list_every_catalog_model_with_its_compatible_datasets(
    client: TestClient, alice: dict[str, str]
) -> None:
    items = client.get("/v1/catalog/models", headers=alice).json()["items"]

    assert [m["name"] for m in items] == list(MODELS)
    mlp = next(m for m in items if m["name"] == "mlp")
    assert mlp["description"] == MODELS["mlp"].description
    assert mlp["compatible_datasets"] == sorted(d for d in DATASETS if check_compatible("mlp", d) is None)


def test_datasets_list_sizes_and_compatible_models(client: TestClient, alice: dict[str, str]) -> None:
    items = client.get("/v1/catalog/datasets", headers=alice).json()["items"]

    assert [d["name"] for d in items] == list(DATASETS)
    digits = next(d for d in items if d["name"] == "digits")
    assert digits["train_size"] == DATASETS["digits"].train_size
    assert "mlp" in digits["compatible_models"]
