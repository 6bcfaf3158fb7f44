"""Open event streams per owner (services/api/streams.py): the count per owner; the cap and
the revocation over a real server are in tests/reliability/test_streams.py."""

from __future__ import annotations

from services.api.streams import StreamSlots


def test_slots_count_per_owner() -> None:
    slots = StreamSlots(2)
    assert slots.try_open(1) and slots.try_open(1) and not slots.try_open(1)
    assert slots.try_open(2) and slots.total == 3
    slots.close(1)
    assert slots.open_for(1) == 1 and slots.try_open(1) and slots.total == 3
