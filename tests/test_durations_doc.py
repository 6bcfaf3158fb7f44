"""docs/development.md's section on the suite's time is the rendering of the kept record
(bench/results/test_durations.json, a full `make test` run): a figure typed in by hand would be
lost at the next `python tools/durations_report.py`."""

from __future__ import annotations

import json
from pathlib import Path

from tools import durations_report as report

ROOT = Path(__file__).resolve().parents[1]


def test_the_section_is_the_kept_records_rendering() -> None:
    record = json.loads(report.KEPT.read_text())
    doc = report.DOC.read_text()
    assert report.rewritten(doc, record) == doc, "run `python tools/durations_report.py --no-copy`"


def test_the_kept_record_is_a_whole_run_with_every_figure() -> None:
    record = json.loads(report.KEPT.read_text())
    assert record["wall_seconds"] > 0 and record["cpu_seconds"] > 0 and len(record["load_at_start"]) == 3
    assert len(record["tests"]) > 1000, "keep the record of a whole `make test`, not of a selection"
    assert {"test", "seconds", "cpu_seconds", "lane", "worker", "outcome"} <= set(record["tests"][0])
    assert {row["lane"] for row in record["tests"]} == {"fast", "full"}
