"""A record of every test's seconds: ``pytest --durations-record PATH`` (``make test`` passes it).

Per test (setup + call + teardown): wall seconds, CPU seconds (this process's user + sys plus
its reaped children's: the workers, ranks and servers a test starts and stops), the lane
(``fast`` when ``make test-fast`` also runs it, else ``full``), the xdist worker and the
outcome. Each xdist worker writes ``PATH.<worker>``; the controller merges them into PATH
with the run's commit, wall seconds, CPU seconds and load averages.
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

# What `make test-fast` leaves out (Makefile): keep the two in step.
FULL_LANE_DIRS = ("tests/reliability/", "tests/bench/")
FULL_LANE_MARKERS = ("browser", "reliability_slow", "sweep", "compose")


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


def lane(item: pytest.Item) -> str:
    path = item.nodeid.split("::", 1)[0]
    if path.startswith(FULL_LANE_DIRS) or any(item.get_closest_marker(m) for m in FULL_LANE_MARKERS):
        return "full"
    return "fast"


class DurationsRecord:
    def __init__(self, path: Path, worker: str | None) -> None:
        self.path = path
        self.worker = worker
        self.rows: list[dict[str, Any]] = []
        self.outcomes: dict[str, str] = {}
        self.started = time.time()
        self.cpu_at_start = _cpu_seconds()
        self.load_at_start = os.getloadavg()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        wall, cpu = time.perf_counter(), _cpu_seconds()
        yield
        self.rows.append(
            {
                "test": item.nodeid,
                "seconds": round(time.perf_counter() - wall, 3),
                "cpu_seconds": round(_cpu_seconds() - cpu, 3),
                "lane": lane(item),
                "worker": self.worker or "main",
                "outcome": self.outcomes.pop(item.nodeid, "passed"),
            }
        )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed or (report.when == "call" and report.skipped) or (report.skipped and report.when == "setup"):
            self.outcomes[report.nodeid] = "failed" if report.failed else "skipped"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.worker is not None:
            Path(f"{self.path}.{self.worker}").write_text(json.dumps(self.rows))
            return
        rows = list(self.rows)
        for part in sorted(self.path.parent.glob(self.path.name + ".gw*")):
            rows.extend(json.loads(part.read_text()))
            part.unlink()
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
