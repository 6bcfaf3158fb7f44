"""services/fleet.py: the API's view of what the fleet offers is read again only after its
refresh period (a submit must not pay a registry read), and a fresh read sees a new worker;
own models (timm:, hf:) are matched by the pattern a worker advertises."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker
from worker_rows import worker_row

from services.fleet import FleetView, offered_as
from services.jobdb import workers as store_workers
from services.worker import registry


def test_the_fleet_view_is_kept_for_its_refresh_period(
    session_factory: sessionmaker[Session],
) -> None:
    kept, fresh = FleetView(refresh_s=3600), FleetView(refresh_s=0)
    with session_factory() as session:
        assert kept.offers(session, 86400) == {} == fresh.offers(session, 86400)
    with session_factory.begin() as session:
        store_workers.register(session, worker_row("w@n", ["a100"], gpus=2))
    with session_factory() as session:
        assert kept.offers(session, 86400) == {}  # read an hour ago, as far as it knows
        assert fresh.offers(session, 86400)["a100"].max_gpus == 2


def test_timm_and_hf_models_are_offered_as_their_namespace_patterns() -> None:
    """What the owndata catalog serves (services.catalog.resolve) as a worker advertises it."""
    assert offered_as("model", "timm:resnet18") == "timm:<name>"
    assert offered_as("model", "hf:gpt2") == "hf:<model_type>"
    assert offered_as("model", "hf:/data/models/tiny") == "hf:<directory>"
    assert offered_as("model", "mlp") == "mlp" and offered_as("dataset", "imagefolder") == "imagefolder"
    models, datasets = registry.served_models(), registry.served_datasets()
    assert ("timm:<name>" in models) == (registry.package_version("timm") is not None)
    assert ("hf:<model_type>" in models) == (registry.package_version("transformers") is not None)
    assert "mlp" in models and {"digits", "imagefolder"} <= set(datasets)
