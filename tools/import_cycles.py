"""Report cycles in the import graph of ``src/`` and ``services/``; exit 1 if there is any.

    python tools/import_cycles.py [--json]

Every ``import`` statement counts, at the top of a module or inside a function (a lazy import
is still an edge: data flows downhill, even lazily). ``from a import b`` is an edge to the
module ``a.b`` when that is a module, else to ``a``. Importing ``a.b`` also runs ``a``'s
``__init__``, but that implicit edge is not counted: a package's ``__init__`` re-exporting its
modules is not a cycle of its own. Each cycle is printed as one strongly connected group of
modules with the import statements (file:line) that tie it together.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the cycles as JSON")
    args = parser.parse_args(argv)
    graph = import_graph()
    found = cycles(graph)
    if args.json:
        print(json.dumps({"modules": len(graph), "cycles": [describe(g, graph) for g in found]}))
    elif found:
        for number, group in enumerate(found, 1):
            print(f"cycle {number}: {', '.join(group)}")
            for edge in describe(group, graph):
                print(f"  {edge}")
    else:
        print(f"no import cycle among {len(graph)} modules of src/ and services/")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
