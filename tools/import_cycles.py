"""Report cycles in the import graph of ``src/`` and ``services/``; exit 1 if there is any.

    python tools/import_cycles.py [--json]

Every ``import`` statement counts, at the top of a module or inside a function (a lazy import
is still an edge: data flows downhill, even lazily). ``from a import b`` is an edge to the
module ``a.b`` when that is a module, else to ``a``. Importing ``a.b`` also runs ``a``'s
``__init__``, but that implicit edge is not counted: a package's ``__init__`` re-exporting its
modules is not a cycle of its own. Each cycle is printed as one strongly connected group of
modules with the import statements (file:line) that tie it together.

Packages are checked too: ``services.dispatch`` imports ``services.housekeeping`` when any
module of the one imports any module of the other, and two packages importing each other are a
cycle even when no module cycle ties them (``dispatch.unsent`` -> ``housekeeping.reaper`` ->
``dispatch.enqueue`` was one). The packages are the folders directly under ``services/`` and
under ``src/accumcore/``; a module outside them (``services/settings.py``) is a package of its own.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (folder, the package prefix its files are imported under)
SOURCES = ((ROOT / "src", ""), (ROOT / "services", "services"))


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module under the source folders."""
    found: dict[str, Path] = {}
    for folder, prefix in SOURCES:
        base = folder if prefix == "" else folder.parent
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts:
                found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported project module, line) for each import statement in ``path``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = nearest(alias.name, modules)
                if target:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = nearest(f"{base}.{alias.name}", modules) or nearest(base, modules)
                if target:
                    yield target, node.lineno


def nearest(dotted: str, modules: dict[str, Path]) -> str | None:
    """``dotted`` if it is one of ours, else its longest prefix that is, else None."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph() -> dict[str, dict[str, list[int]]]:
    """module -> {imported module: [lines]}."""
    modules = module_files()
    graph: dict[str, dict[str, list[int]]] = {}
    for name, path in modules.items():
        edges: dict[str, list[int]] = {}
        for target, line in imports_of(name, path, modules):
            if target != name:
                edges.setdefault(target, []).append(line)
        graph[name] = edges
    return graph


def package_of(module: str) -> str:
    """The package ``module`` belongs to for the package-level check: its folder directly under
    ``services`` or ``accumcore`` (``services.dispatch.unsent`` -> ``services.dispatch``); a
    module at the top of either is its own."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] in ("services", "accumcore") else parts[0]


def package_graph(graph: dict[str, dict[str, list[int]]]) -> dict[str, dict[str, list[str]]]:
    """package -> {imported package: ["module -> module", ...]}: the module edges that cross."""
    packages: dict[str, dict[str, list[str]]] = {}
    for source, targets in graph.items():
        edges = packages.setdefault(package_of(source), {})
        for target in targets:
            if package_of(target) != package_of(source):
                edges.setdefault(package_of(target), []).append(f"{source} -> {target}")
    return packages


def cycles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def describe(group: list[str], graph: dict[str, dict[str, list[int]]]) -> list[str]:
    """The edges inside one group, as ``a -> b (services/a.py:12)``."""
    files = module_files()
    members = set(group)
    return [
        f"{source} -> {target} ({files[source].relative_to(ROOT)}:{','.join(map(str, sorted(set(lines))))})"
        for source in group
        for target, lines in sorted(graph[source].items())
        if target in members
    ]


def describe_packages(group: list[str], packages: dict[str, dict[str, list[str]]]) -> list[str]:
    """The module edges that tie a group of packages, as ``a.x -> b.y``."""
    members = set(group)
    return [edge for source in group for target, edges in sorted(packages[source].items())
            if target in members for edge in sorted(edges)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the cycles as JSON")
    args = parser.parse_args(argv)
    graph = import_graph()
    found = cycles(graph)
    packages = package_graph(graph)
    found_packages = cycles({name: dict.fromkeys(edges, [0]) for name, edges in packages.items()})
    if args.json:
        print(json.dumps({"modules": len(graph), "cycles": [describe(g, graph) for g in found],
                          "packages": len(packages),
                          "package_cycles": [describe_packages(g, packages) for g in found_packages]}))
    elif found or found_packages:
        for number, group in enumerate(found, 1):
            print(f"cycle {number}: {', '.join(group)}")
            for edge in describe(group, graph):
                print(f"  {edge}")
        for number, group in enumerate(found_packages, 1):
            print(f"package cycle {number}: {', '.join(group)}")
            for edge in describe_packages(group, packages):
                print(f"  {edge}")
    else:
        print(f"no import cycle among {len(graph)} modules and {len(packages)} packages of src/ "
              "and services/")
    return 1 if found or found_packages else 0


if __name__ == "__main__":
    sys.exit(main())
