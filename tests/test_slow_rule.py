"""The lane rule: a test over a minute in the durations record must carry ``slow``."""

from __future__ import annotations

import json
from pathlib import Path

from slow_rule import RECORD, SLOW_LIMIT_S, recorded_seconds, unmarked_slow_tests


def test_a_test_over_the_limit_without_a_slow_marker_is_named_slowest_first() -> None:
    seconds = {"a.py::quick": 2.0, "a.py::long": 61.0, "b.py::longer": 300.0, "b.py::marked": 500.0,
               "c.py::reliability": 400.0}
    markers = [("a.py::quick", set()), ("a.py::long", {"parametrize"}), ("b.py::longer", {"timeout"}),
               ("b.py::marked", {"slow"}), ("c.py::reliability", {"reliability_slow"}), ("d.py::new", set())]
    assert unmarked_slow_tests(markers, seconds) == ["b.py::longer", "a.py::long"]
    assert unmarked_slow_tests(markers, seconds, limit=1000.0) == []


def test_the_record_is_read_per_test_and_a_missing_record_is_empty(tmp_path: Path) -> None:
    assert recorded_seconds(tmp_path / "none.json") == {}
    path = tmp_path / "record.json"
    path.write_text(json.dumps({"tests": [{"test": "x.py::t", "seconds": 61.5}]}))
    assert recorded_seconds(path) == {"x.py::t": 61.5}
    # The kept record has tests over the limit (the rule is not vacuous), and this collection,
    # which ran the rule over every test, did not fail: each of them is marked.
    assert max(recorded_seconds(RECORD).values()) > SLOW_LIMIT_S
