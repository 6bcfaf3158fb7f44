"""A record of every test's seconds: ``pytest --durations-record PATH`` (``make test`` passes it).

Per test (setup + call + teardown): wall seconds, CPU seconds (this process's user + sys plus
its reaped children's: the workers, ranks and servers a test starts and stops), the lane
(``fast`` when ``make test-fast`` also runs it, else ``full``: tests/slow_rule.py), the xdist
worker and the outcome. Each xdist worker appends its rows to ``PATH.<worker>.jsonl`` as its
tests end; the controller merges them into PATH with the run's commit, wall seconds, CPU
seconds and load averages.
``tools/durations_report.py`` turns a record into bench/results/ and docs/development.md.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from slow_rule import lane


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--durations-record",
        default=None,
        metavar="PATH",
        help="write each test's wall and CPU seconds and lane to PATH (JSON)",
    )


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class DurationsRecord:
    def __init__(self, path: Path, worker: str | None) -> None:
        self.path = path
        self.worker = worker
        self.rows: list[dict[str, Any]] = []
        self.outcomes: dict[str, str] = {}
        self.started = time.time()
        self.cpu_at_start = _cpu_seconds()
        self.load_at_start = os.getloadavg()
        if worker is not None:
            self._part().unlink(missing_ok=True)  # a previous run's rows

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        wall, cpu = time.perf_counter(), _cpu_seconds()
        yield
        row = {
            "test": item.nodeid,
            "seconds": round(time.perf_counter() - wall, 3),
            "cpu_seconds": round(_cpu_seconds() - cpu, 3),
            "lane": lane(item),
            "worker": self.worker or "main",
            "outcome": self.outcomes.pop(item.nodeid, "passed"),
        }
        if self.worker is None:
            self.rows.append(row)
            return
        # An xdist worker appends each row as its test ends (a line of JSON), so the record
        # keeps every finished test whatever happens to the worker or its folder afterwards.
        part = self._part()
        part.parent.mkdir(parents=True, exist_ok=True)
        with part.open("a") as out:
            out.write(json.dumps(row) + "\n")

    def _part(self) -> Path:
        return Path(f"{self.path}.{self.worker}.jsonl")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed or (report.when == "call" and report.skipped) or (report.skipped and report.when == "setup"):
            self.outcomes[report.nodeid] = "failed" if report.failed else "skipped"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.worker is not None:
            return
        rows = list(self.rows)
        for part in sorted(self.path.parent.glob(self.path.name + ".gw*.jsonl")):
            rows.extend(json.loads(line) for line in part.read_text().splitlines() if line.strip())
            part.unlink()
        if not rows and session.testscollected:
            print(f"\n--durations-record: no test rows reached {self.path.parent} (see tests/durations_record.py)")
        record = {
            "commit": _commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "wall_seconds": round(time.time() - self.started, 1),
            "cpu_seconds": round(_cpu_seconds() - self.cpu_at_start, 1),
            "load_at_start": [round(x, 2) for x in self.load_at_start],
            "load_at_end": [round(x, 2) for x in os.getloadavg()],
            "cores": os.cpu_count(),
            "workers": len({r["worker"] for r in rows}),
            "exit_status": int(session.exitstatus),
            "tests": sorted(rows, key=lambda r: -r["seconds"]),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(record, indent=1) + "\n")


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--durations-record")
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        config.pluginmanager.register(DurationsRecord(Path(path).resolve(), worker), "durations-record")
