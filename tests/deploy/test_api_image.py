"""The API image really runs without torch, and its requirement list covers what it imports.

docker/api.Dockerfile installs the package with `--no-deps` plus docker/api-requirements.txt.
Here a subprocess refuses to import torch, torchvision, numpy, scikit-learn and scipy, then
imports everything the API image runs (the API app, the `accum` CLI, migrations) and serves
/healthz; every distribution it imported must be in the requirement list or be a dependency
of one of its entries.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "docker" / "api-requirements.txt"
# greenlet: SQLAlchemy and Celery import it when present (dev installs have it through
# playwright); refusing it proves the image works without it.
HEAVY = ("torch", "torchvision", "numpy", "sklearn", "scipy", "greenlet")
OPPORTUNISTIC = {"cryptography", "xxhash", "httpx2", "cffi", "brotlicffi", "hiredis"}

PROBE = """
import importlib.abc, json, sys
HEAVY = set(sys.argv[2].split(","))

class RefuseHeavy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"the API image has no {name}")
        return None

before = set(sys.modules)
sys.meta_path.insert(0, RefuseHeavy())
from fastapi.testclient import TestClient
import services.api.main, services.cli.main, services.store.migrate
from services.settings import Settings
app = services.api.main.create_app(Settings(home=sys.argv[1]), run_reaper=False)
with TestClient(app) as client:
    assert client.get("/healthz").status_code == 200
print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
"""


def requirement_closure() -> set[str]:
    """Canonical names of the listed distributions and, recursively, their dependencies."""
    pending = [
        Requirement(line.split("#")[0].strip())
        for line in REQUIREMENTS.read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    seen: set[str] = set()
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        key = f"{name}[{','.join(sorted(requirement.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        seen.add(name)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            dependency = Requirement(text)
            environments = [{"extra": e} for e in requirement.extras] or [{"extra": ""}]
            if dependency.marker is None or any(dependency.marker.evaluate(env) for env in environments):
                pending.append(dependency)
    return {name for name in seen if "[" not in name}


def test_api_imports_no_heavy_package_and_needs_only_listed_ones(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path), ",".join(HEAVY)],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert not set(imported) & set(HEAVY)

    owners = metadata.packages_distributions()
    needed = {
        canonicalize_name(dist)
        for module in imported
        if module not in sys.stdlib_module_names and module not in ("services", "accumcore")
        for dist in owners.get(module, [])
    }
    # TestClient is only this probe's way in; the image serves through uvicorn.
    needed -= {"accum"}
    # Imported only because they happen to be installed here (by the models and test extras):
    # redis-py uses cryptography and xxhash when present, starlette's TestClient prefers
    # httpx2, cryptography brings cffi. The image runs without them.
    needed -= OPPORTUNISTIC
    missing = needed - requirement_closure()
    assert not missing, f"add to {REQUIREMENTS.name}: {sorted(missing)}"


def test_requirement_list_matches_the_project_dependencies() -> None:
    """Every API requirement is a project dependency with the same bounds, or pinned where CI
    pins it (constraints.txt) to a version the project's range admits."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {canonicalize_name(Requirement(d).name): Requirement(d) for d in project}
    constraints = (ROOT / "constraints.txt").read_text().splitlines()
    for line in REQUIREMENTS.read_text().splitlines():
        text = line.split("#")[0].strip()
        if not text:
            continue
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in declared, f"{name} is in the API image but not in pyproject.toml"
        pinned = [spec.version for spec in requirement.specifier if spec.operator == "=="]
        if pinned:  # a pin the package's range admits, the same as CI's (constraints.txt)
            assert declared[name].specifier.contains(pinned[0]), name
            assert f"{requirement.name}=={pinned[0]}" in constraints, name
        else:
            assert str(requirement.specifier) == str(declared[name].specifier), name
    assert not re.search(r"^(torch|torchvision|numpy|scikit-learn)\b", REQUIREMENTS.read_text(), re.M)
