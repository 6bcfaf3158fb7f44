"""The API image really runs without torch, and pyproject's core dependencies cover what it imports.

docker/Dockerfile's `api` stage installs the wheel as `accum[s3]`: the core dependencies (an API
host's) and the s3 extra, with constraints.txt. Here a subprocess refuses to import torch,
torchvision, numpy, scikit-learn and scipy, then imports everything the API image runs (the API
app, the `accum` CLI, migrations) and serves /healthz; every distribution it imported must be
one of those dependencies or a dependency of one of them, and none of them may pull torch.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# greenlet: SQLAlchemy and Celery import it when present (dev installs have it through
# playwright); refusing it proves the image works without it.
HEAVY = ("torch", "torchvision", "numpy", "sklearn", "scipy", "greenlet")
API_EXTRAS = ("s3",)
OPPORTUNISTIC = {"cryptography", "xxhash", "httpx2", "cffi", "brotlicffi", "hiredis", "sniffio", "psutil"}

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
import services.api.main, services.cli.main, services.jobdb.migrate
from services.settings import Settings
app = services.api.main.create_app(Settings(home=sys.argv[1]), run_reaper=False)
with TestClient(app) as client:
    assert client.get("/healthz").status_code == 200
print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
"""


def api_requirements() -> list[Requirement]:
    """What `pip install accum[s3]` asks for: the core dependencies and the API's extras."""
    extras = [d for extra in API_EXTRAS for d in PROJECT["optional-dependencies"][extra]]
    return [Requirement(text) for text in PROJECT["dependencies"] + extras]


def requirement_closure() -> set[str]:
    """Canonical names of the API's distributions and, recursively, their dependencies."""
    pending = api_requirements()
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
    # httpx2, cryptography brings cffi, anyio uses sniffio, and FastAPI's telemetry imports
    # whichever OpenTelemetry SDK parts are installed (its resources import psutil, which the
    # worker extra installs). The image runs without them.
    needed = {n for n in needed - OPPORTUNISTIC if not n.startswith("opentelemetry-")} | (
        needed & {"opentelemetry-api"}
    )
    missing = needed - requirement_closure()
    assert not missing, f"add to pyproject.toml's dependencies: {sorted(missing)}"


def test_an_api_host_install_pulls_no_torch() -> None:
    """The core and s3 requirements, followed through what is installed here, reach no torch,
    numpy or CUDA wheel: those come only with the worker extra."""
    closure = requirement_closure()
    heavy = {n for n in closure if n in {"torch", "torchvision", "numpy", "scikit-learn", "scipy", "triton"} or n.startswith("nvidia-")}
    assert not heavy, f"an API host would install {sorted(heavy)}"
    worker = {canonicalize_name(Requirement(d).name) for d in PROJECT["optional-dependencies"]["worker"]}
    assert {"torch", "torchvision", "numpy"} <= worker


def test_the_images_requirement_lists_are_pyprojects() -> None:
    """docker/requirements.py, which writes the images' lists, follows `accum[worker]`
    self-references and gives the API image exactly the core and s3 requirements."""
    spec = importlib.util.spec_from_file_location("image_requirements", ROOT / "docker" / "requirements.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.requirements(PROJECT, ["s3"]) == sorted(str(r) for r in api_requirements())
    worker = module.requirements(PROJECT, ["models", "s3", "gpu"])
    assert {"torch", "torchvision", "timm", "obstore", "nvidia-ml-py", "fastapi"} <= {
        canonicalize_name(Requirement(text).name) for text in worker
    }
    assert not any(text.startswith("accum") for text in worker)
