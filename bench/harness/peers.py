"""The peers' environment: Lightning and Accelerate, never project dependencies.

`bench/.venv-peers` (gitignored) is a `python -m venv` whose site-packages carries one .pth
line that adds the project's own virtualenv as a further site directory. So the peers run on
the very same torch build and the same editable `accumcore` as we do (a fair comparison, and
no second multi-GB torch download), while `lightning` and `accelerate` are installed only
into the peers' environment, with the project's constraints file.

A bench that needs a peer calls `reexec_in_peers_env(args)`: if the peers are not importable
here, it builds the environment (unless --quick, where it reports "peer not installed") and
re-runs the same script inside it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS_VENV = ROOT / "bench" / ".venv-peers"
PEERS = ("lightning", "accelerate")
_OVERLAY_PTH = "_accum_project_venv.pth"


def peer_versions() -> dict[str, str | None]:
    """Version of each peer importable in this interpreter, None when missing."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in PEERS:
        if importlib.util.find_spec(name) is None:
            found[name] = None
            continue
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "unknown"
    return found


def in_peers_env() -> bool:
    return Path(sys.prefix).resolve() == PEERS_VENV.resolve()


def _peers_python() -> Path:
    return PEERS_VENV / "bin" / "python"


def ensure_peers_env(log=sys.stderr) -> Path:
    """Create bench/.venv-peers and install the peers into it; returns its python.

    Raises RuntimeError with the pip output's tail when the install fails (e.g. no network).
    """
    python = _peers_python()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    project_site = sysconfig.get_paths()["purelib"]
    # addsitedir (not a bare path) so the project venv's own .pth files, among them the
    # editable-install finder for accumcore, are processed too.
    Path(purelib, _OVERLAY_PTH).write_text(f"import site; site.addsitedir({project_site!r})\n")
    check = subprocess.run(
        [str(python), "-c", "import lightning, accelerate"], capture_output=True, text=True
    )
    if check.returncode == 0:
        return python
    print(f"installing {', '.join(PEERS)} into {PEERS_VENV} ...", file=log)
    install = subprocess.run(
        [
            str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "-c", str(ROOT / "constraints.txt"), *PEERS,
        ],
        capture_output=True,
        text=True,
    )
    if install.returncode != 0:
        tail = (install.stdout + install.stderr)[-2000:]
        raise RuntimeError(f"could not install the peers into {PEERS_VENV}:\n{tail}")
    return python


def reexec_in_peers_env(quick: bool) -> str | None:
    """Make the peers importable: re-run this script in the peers' env, or say why not.

    Returns None when the peers are importable in this interpreter (carry on), or a reason
    string when they are not and will not be (quick mode, or the install failed). When it
    re-runs the script, this process exits with the child's exit code and never returns.
    """
    if all(peer_versions().values()):
        return None
    if in_peers_env():
        return "peer not installed: the peers' environment lacks " + ", ".join(
            name for name, found in peer_versions().items() if not found
        )
    if quick:
        return "peer not installed (quick mode never installs; run without --quick to set up bench/.venv-peers)"
    try:
        python = ensure_peers_env()
    except (RuntimeError, subprocess.CalledProcessError, OSError) as error:
        return f"peer not installed: {error}"
    # The same module, as `python -m bench.<package>.<name>` from the repository root (the
    # peers' env sees our code through the site-packages link ensure_peers_env made).
    module = sys.modules["__main__"].__spec__
    command = [str(python), "-m", module.name] if module is not None else [str(python), os.path.abspath(sys.argv[0])]
    completed = subprocess.run([*command, *sys.argv[1:]], cwd=ROOT)
    raise SystemExit(completed.returncode)
