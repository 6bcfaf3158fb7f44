"""services/fleet.py: the API's view of what the fleet offers is read again only after its
refresh period (a submit must not pay a registry read), and a fresh read sees a new worker."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker
from worker_rows import worker_row

from services.fleet import FleetView
from services.store import workers as store_workers


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
