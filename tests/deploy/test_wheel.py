"""The wheel stands alone: built from this tree, installed without the checkout, `accum demo` runs
from an empty folder to a succeeded job.

What this catches: migrations, example specs, the digits file or a package left out of the
wheel (pyproject's explicit package list, checked against the tree here too), and code that
looks for them relative to a checkout. The deployment check runs in `make compose-test`, on the
worker image, which docker/Dockerfile builds from this tree's wheel alone (`pip wheel` of the
sources, then `pip install --no-deps` of that wheel over its pinned dependencies, then
`pip check`): the image runs `accum demo` in an empty folder, as its own user, and the demo's
database must be migrated to head from the wheel's package data. It ran in `make test` until
issue 39 as a fresh venv that pip filled with torch (3.5 GB, about 290 s); the image build
already installs the same wheel.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = {"services": ROOT / "services", "accum": ROOT / "src" / "accum", "accumcore": ROOT / "src" / "accumcore"}


def run(args: list[str | Path], timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False, **kwargs  # type: ignore[call-overload]
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def test_the_package_list_names_every_package_in_the_tree() -> None:
    """Each folder of code, and each folder of data files Python could import as a namespace
    package (setuptools prints "Package would be ignored" for one left out, at every install)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    in_tree = {
        ".".join((name, *folder.relative_to(root).parts))
        for name, root in PACKAGE_ROOTS.items()
        for folder in [root, *root.rglob("*")]
        if folder.is_dir() and folder.name != "__pycache__"
        and all(part.isidentifier() for part in folder.relative_to(root).parts)
        and any(f.is_file() for f in folder.iterdir())
    }
    assert in_tree - listed == set(), "add them to [tool.setuptools] packages in pyproject.toml"


DOCKER = os.environ.get("DOCKER", "docker")
DEMO_IN_AN_EMPTY_FOLDER = (
    'cd "$(mktemp -d)" && accum demo && python -c "'
    "from services.jobdb.migrate import current_revision, head_revision;"
    "from services.settings import get_settings;"
    'print(\'at head:\', current_revision(get_settings().database_url) == head_revision())"'
)


@pytest.mark.compose
@pytest.mark.timeout(900)
def test_the_worker_image_runs_the_demo_from_an_empty_folder() -> None:
    # Built by docker/compose_test.sh just before (the image of the wheel, nothing of the checkout).
    demo = run([DOCKER, "run", "--rm", "--network=host", "accum-worker",
                "sh", "-c", DEMO_IN_AN_EMPTY_FOLDER], 600)
    assert " succeeded in " in demo.stdout, demo.stdout[-2000:]
    assert "final validation accuracy: " in demo.stdout
    # The demo migrated its own database (package data) and kept the job there.
    assert "at head: True" in demo.stdout, demo.stdout[-2000:]
