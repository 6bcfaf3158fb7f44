"""The import graph: no cycle among the modules of src/ and services/ (tools/import_cycles.py),
and every module imports on its own, with none of ours loaded before it (an import that only
works after some other module was imported first is a hidden cycle or a missing import)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import import_cycles  # noqa: E402  (tools/ is not a package)

# Import each module with every module of ours dropped from sys.modules first (third-party
# ones stay: re-importing torch per module would take minutes); one JSON line of failures.
ALONE = """
import importlib, json, sys, traceback
OURS = ("accum", "accumcore", "services")
failures = {}
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split(".")[0] in OURS]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException:
        failures[name] = traceback.format_exc(limit=-3)
print(json.dumps(failures))
"""


def test_the_cycle_tool_finds_no_cycle() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "import_cycles.py")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_cycle_tool_reports_a_cycle() -> None:
    graph = {"a": {"b": [3]}, "b": {"c": [1]}, "c": {"a": [7], "d": [2]}, "d": {}}
    assert import_cycles.cycles(graph) == [["a", "b", "c"]]
    assert import_cycles.cycles({"a": {"b": [1]}, "b": {}}) == []


def test_the_cycle_tool_reports_packages_that_import_each_other() -> None:
    """No module cycle, yet ``services.x`` and ``services.y`` import each other (the dispatch <->
    housekeeping shape it once had): a package cycle, with the module edges that make it."""
    graph: dict[str, dict[str, list[int]]] = {
        "services.x.a": {"services.y.b": [3]}, "services.y.b": {"services.x.c": [5]},
        "services.x.c": {}, "accumcore.trainer": {"accumcore.window": [1]}, "accumcore.window": {},
    }
    assert import_cycles.cycles(graph) == []
    packages = import_cycles.package_graph(graph)
    found = import_cycles.cycles({name: dict.fromkeys(edges, [0]) for name, edges in packages.items()})
    assert found == [["services.x", "services.y"]]
    assert import_cycles.describe_packages(found[0], packages) == [
        "services.x.a -> services.y.b", "services.y.b -> services.x.c"]
    assert import_cycles.package_of("services.settings") == "services.settings"
    assert import_cycles.package_of("accumcore.trainer") == "accumcore.trainer"


@pytest.mark.slow
def test_every_module_imports_alone() -> None:
    # `python -m` entry points run their command on import; what they import is covered.
    modules = sorted(m for m in import_cycles.module_files() if not m.endswith(".__main__"))
    assert "services.dispatch.enqueue" in modules and "accumcore.trainer" in modules
    result = subprocess.run(
        [sys.executable, "-c", ALONE, *modules],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    failures = json.loads(result.stdout.strip().splitlines()[-1])
    assert failures == {}, "\n".join(f"{name}:\n{trace}" for name, trace in failures.items())
