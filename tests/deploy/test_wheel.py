"""The wheel stands alone: built from this tree, installed in a fresh virtual environment
outside the repository, `accum demo` runs from an empty folder to a succeeded job.

What this catches: migrations, example specs, the digits file or a package left out of the
wheel (pyproject's explicit package list, checked against the tree here too), and code that
looks for them relative to a checkout. The venv gets `accum[worker]` with constraints.txt, so
pip installs the torch CI pins (from this machine's local wheels where pip is configured so).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
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
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    in_tree = {
        ".".join((name, *init.parent.relative_to(root).parts))
        for name, root in PACKAGE_ROOTS.items()
        for init in root.rglob("__init__.py")
    }
    assert in_tree - listed == set(), "add them to [tool.setuptools] packages in pyproject.toml"


@pytest.mark.slow
@pytest.mark.timeout(1500)  # pip unpacks torch and its CUDA wheels (3.5 GB): 9 min on a busy disk
def test_wheel_in_a_fresh_venv_runs_the_demo_from_an_empty_folder() -> None:
    # Not tmp_path: another pytest session on this machine, starting during the long install,
    # prunes older sessions' tmp_path folders (pytest keeps three) and took this venv with it.
    with tempfile.TemporaryDirectory(prefix="accum-wheel-") as folder:
        installed_wheel_runs_the_demo(Path(folder))


def installed_wheel_runs_the_demo(tmp_path: Path) -> None:
    source, dist, venv, empty = (tmp_path / n for n in ("source", "dist", "venv", "empty"))
    empty.mkdir()
    # Nothing of this checkout may leak in: no PYTHONPATH (pip would take an accum.egg-info on
    # it for an installed accum), no ACCUM_* settings, an empty working folder.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("ACCUM_")}
    # Built from a copy: an in-tree build leaves build/ behind, whose stale files a later
    # wheel would ship.
    for name in ("src", "services", "migrations", "examples"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, source], 300, env=env)
    (wheel,) = dist.glob("accum-*.whl")
    run([sys.executable, "-m", "venv", venv], 120, env=env)
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "--quiet", "-c", ROOT / "constraints.txt", f"{wheel}[worker]"], 900, env=env)

    where = run([python, "-c", "import services; print(services.__file__)"], 60, cwd=empty, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout

    demo = run([venv / "bin" / "accum", "demo"], 600, cwd=empty, env=env)
    assert " succeeded in " in demo.stdout, demo.stdout[-2000:]
    assert "final validation accuracy: " in demo.stdout
    # The demo migrated its own database (package data) and kept the job there.
    status = run(
        [python, "-c", "from services.jobdb.migrate import current_revision, head_revision;"
         "from services.settings import get_settings;"
         "print(current_revision(get_settings().database_url) == head_revision())"],
        60, cwd=empty, env=env,
    )
    assert status.stdout.strip() == "True"
