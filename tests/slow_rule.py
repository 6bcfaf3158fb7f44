"""Lanes by markers only, and a rule that keeps them honest.

A test's markers decide its lane: ``slow``, ``reliability_slow``, ``browser``, ``sweep`` and
``compose`` keep it out of ``make test-fast`` (``make test`` leaves out only
``reliability_slow`` and ``compose``). A test that took more than SLOW_LIMIT_S in the kept
durations record (bench/results/test_durations.json, written by ``make test``) and carries
neither ``slow`` nor ``reliability_slow`` fails the collection, with the names and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

# Out of `make test-fast`; the Makefile's `-m` expression names the same markers.
FULL_LANE_MARKERS = ("slow", "reliability_slow", "browser", "sweep", "compose")
SLOW_MARKERS = ("slow", "reliability_slow")
SLOW_LIMIT_S = 60.0
RECORD = Path(__file__).resolve().parent.parent / "bench" / "results" / "test_durations.json"


def lane(item: pytest.Item) -> str:
    return "full" if any(item.get_closest_marker(m) for m in FULL_LANE_MARKERS) else "fast"


def recorded_seconds(record_path: Path) -> dict[str, float]:
    """Each test's seconds in a durations record; empty when there is none."""
    if not record_path.is_file():
        return {}
    record = json.loads(record_path.read_text())
    return {row["test"]: float(row["seconds"]) for row in record.get("tests", [])}


def unmarked_slow_tests(
    markers_by_test: Iterable[tuple[str, set[str]]], seconds: Mapping[str, float], limit: float = SLOW_LIMIT_S
) -> list[str]:
    """The tests over ``limit`` seconds in the record that carry no slow marker, slowest first."""
    found = [
        test
        for test, markers in markers_by_test
        if seconds.get(test, 0.0) > limit and not markers.intersection(SLOW_MARKERS)
    ]
    return sorted(found, key=lambda test: -seconds[test])


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = recorded_seconds(RECORD)
    unmarked = unmarked_slow_tests(((item.nodeid, {m.name for m in item.iter_markers()}) for item in items), seconds)
    if unmarked:
        lines = "\n".join(f"  {test} ({seconds[test]:.0f} s)" for test in unmarked)
        raise pytest.UsageError(
            f"these tests took more than {SLOW_LIMIT_S:.0f} s in {RECORD.name} and carry no `slow` marker:\n"
            f"{lines}\nmark them @pytest.mark.slow (or make them faster and re-record with `make test` "
            "then `python tools/durations_report.py`)"
        )
