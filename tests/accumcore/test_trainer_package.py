"""accumcore is the trainer library only: it never imports the service (`services`), not even
lazily inside a function, and its public names are plain imports."""

from __future__ import annotations

import ast
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


def test_public_names_are_plain_attributes_of_the_package() -> None:
    assert all(name in vars(accumcore) for name in accumcore.__all__)
    assert "__getattr__" not in vars(accumcore)  # no lazy module attributes
