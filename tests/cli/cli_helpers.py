"""Helpers for the CLI tests: run the installed `accum` script, readiness."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ACCUM = shutil.which("accum", path=str(Path(sys.executable).parent)) or "accum"


@dataclass(frozen=True)
class Server:
    url: str
    token: str
    home: Path
    env: dict[str, str]


def accum_env(home: Path) -> dict[str, str]:
    """ACCUM_HOME=home, and a per-user config dir of its own (what `accum up` records there
    never reaches the real ~/.config/accum, nor another test's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCUM_")}
    env["ACCUM_HOME"] = str(home)
    env["XDG_CONFIG_HOME"] = str(home / "user-config")
    # No ACCUM_ALLOW_ROOT: tests run as root here, so each `accum up` / `accum demo` test also
    # proves the one-machine service starts its worker as root (services/cli/local.py).
    return env


def run_accum(
    *args: str, env: dict[str, str], timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ACCUM, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False,
        cwd=cwd,
    )


def wait_until_ready(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the API exited with code {process.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the API at {url} was not ready within {timeout} s")




def accum_in_process(capsys: Any, *args: str) -> tuple[int, str, str]:
    """`accum ARGS` through the console script's target, in this process: (code, out, err)."""
    from services.cli.main import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def assert_fits(text: str, columns: int = 80) -> None:
    """Every line of a command's output fits the terminal (COLUMNS=80 in these tests)."""
    wide = [line for line in text.splitlines() if len(line) > columns]
    assert not wide, f"lines wider than {columns} columns: {wide}"


def one_entry(text: str, columns: int = 80) -> bool:
    """One message, wrapped to the terminal: every line fits, the following ones are indented
    under the first (not several messages, not one cut mid-word by the terminal)."""
    first, *rest = text.strip("\n").splitlines()
    return all(len(line) <= columns for line in [first, *rest]) and all(r.startswith("  ") for r in rest)


def unwrapped(text: str) -> str:
    """A message wrapped by `hanging` back on one line."""
    return " ".join(line.strip() for line in text.strip().splitlines())
