"""accumcore is the trainer library only: it never imports the service (`services`), not even
lazily inside a function, and its public names are plain imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import accumcore

PACKAGE = Path(accumcore.__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` anywhere in the file names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_accumcore_module_imports_services() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10, f"found only {files} under {PACKAGE}"
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            name for name in imported_modules(path) if name.split(".")[0] == "services"
        )
        for path in files
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_every_module_imports_alone_and_loads_nothing_of_services() -> None:
    code = (
        "import importlib, pkgutil, sys, accumcore\n"
        "for info in pkgutil.walk_packages(accumcore.__path__, 'accumcore.'):\n"
        "    importlib.import_module(info.name)\n"
        "assert all(getattr(accumcore, name) for name in accumcore.__all__)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'services')\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
